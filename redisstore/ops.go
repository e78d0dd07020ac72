package redisstore

import (
	"context"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/redisstore/internal/health"
)

// Settle gives back what a reservation did not use, or charges its
// overrun, with one call of lua.Settle over the dimensions that take part.
func (r *backend) Settle(ctx context.Context, st *store.Settlement) error {
	if st.Local { // granted by a failure policy: nothing of it is in Redis
		return nil
	}
	var rk []string
	sent := store.KeySet{Slot: st.Slot} // the dimensions sent, in the script's order: its errors name them by index
	args := []any{r.now(st.Now), script.Float(st.At), "0"}
	if st.Holes {
		args[2] = "1"
	}
	all := redisKeys(st.KeySet)
	for i, d := range st.Dims {
		actual := int64(-1)
		if st.Actual != nil {
			actual = st.Actual[i]
		}
		if !d.Settles(st.Costs[i], actual) {
			continue
		}
		rk = append(rk, all[2*i])
		sent.Dims, sent.Keys = append(sent.Dims, d), append(sent.Keys, st.Keys[i])
		args = appendKindParams(args, d)
		args = append(args, script.Float(st.Tags[i]), script.Float(st.Seqs[i]), strconv.FormatInt(st.Costs[i], 10), strconv.FormatInt(actual, 10))
	}
	if len(rk) == 0 {
		return nil
	}
	return r.run(ctx, "settle", sent, func(ctx context.Context) error { return script.Settle.Run(ctx, r.client, rk, args...).Err() })
}

// run is do for an operation of one command, whatever its reply.
func (r *backend) run(ctx context.Context, op string, ks store.KeySet, f func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.do(ctx, op, ks, nil, func(ctx context.Context, probe bool) error { return r.call(ctx, probe, f) })
}

// Pause sets each dimension's pause key, which lives as long as its pause.
func (r *backend) Pause(ctx context.Context, ks store.KeySet, now, d float64) error {
	all := redisKeys(ks)
	pk := make([]string, len(ks.Dims))
	for i := range ks.Dims {
		pk[i] = all[2*i+1]
	}
	return r.run(ctx, "pause", ks, func(ctx context.Context) error {
		return script.Pause.Run(ctx, r.client, pk, r.now(now), script.Float(d)).Err()
	})
}

// Clamp sets a partner's clamp on each dimension's key (lua.Clamp).
func (r *backend) Clamp(ctx context.Context, ks store.KeySet, now, interval, span float64, keepTighter bool) error {
	all := redisKeys(ks)
	sk := make([]string, len(ks.Dims))
	for i := range ks.Dims {
		sk[i] = all[2*i]
	}
	return r.run(ctx, "clamp", ks, func(ctx context.Context) error {
		tighter := "0"
		if keepTighter {
			tighter = "1"
		}
		return script.Clamp.Run(ctx, r.client, sk, r.now(now), script.Float(interval), script.Float(span), tighter).Err()
	})
}

// Reset deletes every key of the dimensions, derived keys included, in one
// script call (lua.ResetKeys): a key of the GCRA family whose reservations
// may still be given back keeps the Ledger that gives them nothing back.
func (r *backend) Reset(ctx context.Context, ks store.KeySet, now float64) error {
	all := redisKeys(ks)
	sks := make([]string, len(ks.Dims))
	args := make([]any, 0, 1+7*len(ks.Dims))
	args = append(args, r.now(now))
	for i := range ks.Dims {
		sks[i] = all[2*i]
		args = appendKindParams(args, ks.Dims[i])
	}
	return r.run(ctx, "reset", ks, func(ctx context.Context) error { return script.Reset.Run(ctx, r.client, sks, args...).Err() })
}

// appendKindParams appends d's algorithm kind and its six parameters, as
// the scripts read a key's contract.
func appendKindParams(args []any, d *store.Dim) []any {
	kind, p := d.Alg.Params()
	args = append(args, kind)
	for _, x := range p {
		args = append(args, script.Float(x))
	}
	return args
}

// PauseLeft reads the pause keys' TTLs: a pause key lives exactly as long
// as its pause, on the server's clock, so no clock is compared. One round
// trip (PTTL for one key, a pipeline for several). While Redis is judged
// down it is not asked (an outage: FailLocal answers from its twins), or
// every request that slept would spend the store's timeout here.
func (r *backend) PauseLeft(ctx context.Context, ks store.KeySet, now float64) (float64, error) {
	all := redisKeys(ks)
	left := 0.0
	err := r.do(ctx, "pause_left", ks, nil, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			cmds, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i := range ks.Dims {
					if r.clientClock { // the pause's end, on the shaper's clock: exact
						p.Get(ctx, all[2*i+1])
					} else { // its time to live, on the server's: rounded up to the ms
						p.PTTL(ctx, all[2*i+1])
					}
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			longest := 0.0
			for _, c := range cmds {
				switch c := c.(type) {
				case *redis.DurationCmd:
					longest = max(longest, algorithms.DurationMillis(c.Val()))
				case *redis.StringCmd:
					if end, err := strconv.ParseFloat(c.Val(), 64); err == nil {
						longest = max(longest, end-now)
					}
				}
			}
			left = longest
			return nil
		})
	})
	if err != nil { // f may still run (see call): do not read left
		return 0, err
	}
	return left, nil
}

// Status reads the keys' standing with one read-only script call.
func (r *backend) Status(ctx context.Context, q *store.Query) error {
	keys, args := redisKeys(q.KeySet), r.dimsArgs(q.Algs, q.Costs, q.Now, store.NoLimit, q.Any)
	var v any
	err := r.do(ctx, "status", q.KeySet, nil, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			var err error
			v, err = script.Status.Run(ctx, r.client, keys, args...).Result()
			return err
		})
	})
	if err != nil {
		return err
	}
	rep, err := script.ParseStatus(v, len(q.Dims))
	if err != nil {
		return &Error{Op: "status", Err: err}
	}
	q.At, q.Until, q.Binding, q.Figures = rep.Now, rep.Until, rep.Binding, rep.Dims
	return nil
}

// ReadContract reads prefix's live contract (lua.Contract). While Redis is
// judged down it is not asked: the shapers read it in the background,
// nobody waits for it, and it must not take the probe's turn (health.Tracker)
// from the calls that are waited for.
func (r *backend) ReadContract(ctx context.Context, prefix string) (store.Record, error) {
	if !r.health.IsUp() {
		return store.Record{}, health.ErrJudgedDown
	}
	return r.contract(ctx, prefix)
}

// WriteContract records one change of prefix's live contract. It goes to
// Redis whatever the server's health (a change the fleet would not see is
// not made), and any failure is an *Error.
func (r *backend) WriteContract(ctx context.Context, prefix, identity, field, value string) (store.Record, error) {
	rec, err := r.contract(ctx, prefix, identity, field, value)
	if err != nil {
		if e := callerDone(ctx); e != nil {
			return store.Record{}, e
		}
		return store.Record{}, &Error{Op: "set_contract", Err: err}
	}
	return rec, nil
}

// contract runs lua.Contract on prefix's record: a read without args, a
// change with them. It is never the probe of a server judged down.
func (r *backend) contract(ctx context.Context, prefix string, args ...any) (store.Record, error) {
	var rec store.Record
	err := r.call(ctx, false, func(ctx context.Context) error {
		kv, err := script.Contract.Run(ctx, r.client, []string{contractKey(prefix)}, args...).StringSlice()
		if err != nil {
			return err
		}
		rec, err = store.ParseRecord(kv)
		return err
	})
	if err != nil { // f may still run (see call): do not read rec
		return store.Record{}, err
	}
	return rec, nil
}
