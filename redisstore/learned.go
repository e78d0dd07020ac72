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
// never holds a raw ":", and no other kind has ":a" right after the tag).
// Its tallies are the hash at the same key followed by ":n":
//
//	E(prefix) "{" T(slot) "}:a:" P(key)
//	E(prefix) "{" T(slot) "}:a:" P(key) ":n"
func learnedKey(l *store.Learned) string {
	return escape(l.Base) + "{" + escapeTag(l.Slot) + "}:a:" + escapePart(l.Key)
}

// Learn adds op's tallies, compares l's record's version with op.Want
// and, when they match, writes op.Rec and sets op.Clamp, in one script
// call (lua.Learn).
func (r *backend) Learn(ctx context.Context, l *store.Learned, op *store.LearnOp) (string, []store.Tally, error) {
	if r.err != nil {
		return "", nil, r.err
	}
	rk := learnedKey(l)
	keys := []string{rk, rk + ":n"}
	c := op.Clamp
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
	oldest := int64((op.Now - store.TallyLife) / store.TallyWidth)
	reset := "0"
	if op.Reset && c != nil {
		reset = "1"
	}
	args := make([]any, 0, 12+3*len(op.Add))
	args = append(args, strconv.FormatUint(op.Want, 10), op.Rec, script.Float(op.TTL), clampNow, interval, span, tighter,
		strconv.FormatInt(oldest, 10), strconv.FormatInt(op.From, 10), script.Float(store.TallyLife), reset, strconv.Itoa(len(op.Add)))
	for _, t := range op.Add {
		args = append(args, strconv.FormatInt(t.Bucket, 10), strconv.FormatInt(t.Accepted, 10), strconv.FormatInt(t.Answered, 10))
	}
	if reset == "1" { // each state key's contract, for the Ledger a reset key keeps (lua.Reset)
		for _, d := range l.Dims {
			args = appendKindParams(args, d)
		}
	}
	var v any
	err := r.run(ctx, "learn", l.KeySet, func(ctx context.Context) error {
		var err error
		v, err = script.Learn.Run(ctx, r.client, keys, args...).Result()
		return err
	})
	if err != nil {
		return "", nil, err
	}
	rec, tallies, perr := parseLearn(v)
	if perr != nil {
		return "", nil, &Error{Op: "learn", Err: perr}
	}
	return rec, tallies, nil
}

// parseLearn reads lua.Learn's reply.
func parseLearn(v any) (string, []store.Tally, error) {
	arr, ok := v.([]any)
	if !ok || len(arr) != 2 {
		return "", nil, fmt.Errorf("unexpected reply %T", v)
	}
	rec, ok := arr[0].(string)
	flat, ok2 := arr[1].([]any)
	if !ok || !ok2 || len(flat)%3 != 0 {
		return "", nil, fmt.Errorf("unexpected reply %v", v)
	}
	var out []store.Tally
	for i := 0; i < len(flat); i += 3 {
		var n [3]int64
		for j := range n {
			x, ok := flat[i+j].(int64)
			if !ok {
				return "", nil, fmt.Errorf("unexpected tally %v", flat[i+j])
			}
			n[j] = x
		}
		out = append(out, store.Tally{Bucket: n[0], Accepted: n[1], Answered: n[2]})
	}
	return rec, out, nil
}
