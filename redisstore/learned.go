package redisstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// learnedKey is the Redis key of l's learned record: a string
// (lua.Learn) in the hash slot of l.Slot, after the escaped prefix and
// tag, ":a:" and the caller's key, which no other kind has (a name part
// never holds a raw ":", and no other kind has ":a" right after the tag):
//
//	E(prefix) "{" T(slot) "}:a:" P(key)
func learnedKey(l *store.Learned) string {
	return escape(l.Base) + "{" + escapeTag(l.Slot) + "}:a:" + escapePart(l.Key)
}

// Learn compares l's record's version with want and, when they match,
// writes rec and sets c, in one script call (lua.Learn).
func (r *backend) Learn(ctx context.Context, l *store.Learned, now float64, want uint64, rec string, ttl float64, c *store.LearnClamp) (string, error) {
	if r.err != nil {
		return "", r.err
	}
	keys := []string{learnedKey(l)}
	if c != nil {
		all := redisKeys(l.KeySet)
		for i := range l.Dims {
			keys = append(keys, all[2*i])
		}
	}
	clampNow, interval, span, tighter := "-", "0", "0", "0"
	if c != nil {
		clampNow, interval, span = r.now(c.Now), script.Float(c.Interval), script.Float(c.Span)
		if c.Tighter {
			tighter = "1"
		}
	}
	var v any
	err := r.run(ctx, "learn", l.KeySet, func(ctx context.Context) error {
		var err error
		v, err = script.Learn.Run(ctx, r.client, keys, strconv.FormatUint(want, 10), rec, script.Float(ttl), clampNow, interval, span, tighter).Result()
		return err
	})
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", &Error{Op: "learn", Err: fmt.Errorf("unexpected reply %T", v)}
	}
	return s, nil
}
