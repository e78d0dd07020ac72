package redisstore

import (
	"context"
	"errors"
	"strings"

	"github.com/throttlekit/throttlekit-go/internal/fair"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// fairKey is the Redis key of t's fair turns: a hash (lua.FairTurn) in the
// hash slot of t.Slot, after the escaped prefix and tag, ":q:" and the
// caller's key, which no other kind has (a name part never holds a raw
// ":", and no other kind has ":q" right after the tag):
//
//	E(prefix) "{" T(slot) "}:q:" P(key)
func fairKey(t *store.Turns) string {
	return escape(t.Base) + "{" + escapeTag(t.Slot) + "}:q:" + escapePart(t.Key)
}

// Turn applies fair.State.Turn to t's key in one script call
// (lua.FairTurn), on Redis TIME unless the store decides on the client
// clock.
func (r *backend) Turn(ctx context.Context, t *store.Turns, p fair.Params, ups []fair.Update) (fair.Reply, error) {
	if err := ctx.Err(); err != nil {
		return fair.Reply{}, err
	}
	if r.err != nil {
		return fair.Reply{}, r.err
	}
	key := fairKey(t)
	ks := store.KeySet{Keys: []string{t.Key}, Slot: t.Slot}
	var v any
	err := r.do(ctx, "fair_turn", ks, nil, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			var err error
			v, err = script.FairTurn.Run(ctx, r.client, []string{key}, script.TurnArgs(r.now(p.Now), p, t.Owner, ups)...).Result()
			return err
		})
	})
	if err != nil { // f may still run (see call): do not read v
		var se *StateError
		if errors.As(err, &se) && se.Key == "" { // name the user's key, as the other keys do
			se.Key, se.Reason = t.Key, strings.TrimPrefix(se.Reason, "TKSTATE 0 ")
		}
		return fair.Reply{}, err
	}
	reply, err := script.ParseTurn(v)
	if err != nil {
		return fair.Reply{}, &Error{Op: "fair_turn", Err: err}
	}
	return reply, nil
}
