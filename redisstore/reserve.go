package redisstore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// Reserve decides req with one script call: through the lane of its hash
// slot when the store coalesces (see coalesce.go), else a call of its own.
func (r *backend) Reserve(ctx context.Context, req *store.Request) error {
	return r.do(ctx, "reserve", req.KeySet, req, func(ctx context.Context, probe bool) error {
		return r.reserveRedis(ctx, probe, req)
	})
}

// reserveRedis decides req on Redis: through the lane of its hash slot
// when the store coalesces (see coalesce.go), else with a call of its own.
func (r *backend) reserveRedis(ctx context.Context, probe bool, req *store.Request) error {
	if r.lanes != nil && !probe && req.Floor == 0 {
		return r.coalesce(ctx, req)
	}
	return r.reserveAlone(ctx, probe, req)
}

// reserveAlone decides req with one call of its own.
func (r *backend) reserveAlone(ctx context.Context, probe bool, req *store.Request) error {
	var c reserveCall
	r.prepare(&c, req)
	return r.callAlone(ctx, probe, &c, req)
}

// callAlone runs req's call c, prepared, by itself.
func (r *backend) callAlone(ctx context.Context, probe bool, c *reserveCall, req *store.Request) error {
	var v any
	if !r.clientClock {
		c.sent = req.Dims[0].Clock.Now()
	}
	err := r.call(ctx, probe, func(ctx context.Context) error {
		var err error
		v, err = c.script().Run(ctx, r.client, c.keys, c.args...).Result()
		return err
	})
	if err != nil {
		return err
	}
	return r.finish(c, req, v)
}

// reserveCall is one reservation's script call: its keys and arguments,
// and what reading its reply takes.
type reserveCall struct {
	keys  []string
	args  []any
	gcra  *gcra.Kernel // ReserveGCRA's kernel (nil: Reserve), within the caller's deadline
	floor float64      // ReserveGCRA: the handoff floor passed (0: none)
	// took is how long (ms) the server ran after deciding this reservation
	// on its TIME, before it replied: a batch's (see coalesce.go). A delay
	// counts from the reply, so it is taken off.
	took float64
	// late is how long (ms, client clock) after the caller's instant the
	// call decides: a batch decides its queued reservations at the instant
	// it is sent (see restamp). The delay counts from the caller's instant,
	// so it is added.
	late float64
	// sent is when the call went out, on the shaper's clock: with took and
	// the server's instant, what maps its slot onto that clock (skew.go).
	// Zero with the client clock.
	sent time.Time
}

func (c *reserveCall) script() *redis.Script {
	if c.gcra != nil {
		return script.ReserveGCRA
	}
	return script.Reserve
}

// prepare builds req's call: ReserveGCRA for most calls (one dimension of
// the GCRA family, with its parameters formatted once, at bind), Reserve for
// the others.
//
// A request carrying a Floor (FailLocal's handoff, see failover.go) passes
// it to ReserveGCRA as a TAT floor: Redis's schedule continues after the
// local slots it has not seen.
func (r *backend) prepare(c *reserveCall, req *store.Request) {
	c.keys = redisKeys(req.KeySet)
	d := req.Dims[0]
	if len(req.Dims) != 1 || d.Kern == nil {
		c.args = r.dimsArgs(req.Algs, req.Costs, req.Now, req.Limit, req.Any)
		return
	}
	rd := redisOf(d)
	params, k := &rd.params[0], d.Kern
	if req.Algs[0] == d.Allow {
		params, k = &rd.params[1], d.KernAllow
	}
	c.args = script.ReserveGCRAArgs(r.now(req.Now), params, req.Costs[0])
	if req.Limit < k.MaxWait { // the caller's deadline comes first: the script waits no longer
		k = store.Within(k, req.Limit, new(gcra.Kernel))
		c.args[3] = script.Float(k.MaxWait)
	}
	c.gcra = k
	if req.Floor > 0 { // FailLocal's handoff (see failover.go)
		c.floor = req.Floor
		c.args = append(c.args, script.Float(c.floor))
	}
}

// finish reads the reply v of req's call c into req. ReserveGCRA replies
// with the inputs of its transition; the figures are recomputed here with
// the same math.
func (r *backend) finish(c *reserveCall, req *store.Request, v any) error {
	if c.gcra == nil {
		rep, err := script.ParseReserve(v, len(req.Dims))
		if err != nil {
			return err
		}
		req.Dec = algorithms.AllDecision{Decision: decisionOf(rep.Allowed, r.fromReply(c, req, rep.Allowed, rep.Now, rep.Wait)), Binding: rep.Binding, Wait: rep.Wait, Took: rep.Took}
		req.Dec.Remaining = gcra.Units(rep.Remaining)
		req.Tags, req.Seqs = rep.Tags, rep.Seqs
		req.At, req.Decided = rep.Now+rep.Wait, rep.Now // as the script computed it
		return nil
	}
	k := c.gcra
	rep, err := script.ParseReserveGCRA(v, req.Now+c.late)
	if err != nil {
		return err
	}
	rep.Handoff = c.floor
	allowed, wait, tag, err := rep.Decide(k, req.Costs[0])
	if err != nil {
		return err
	}
	req.Dec = algorithms.AllDecision{Decision: decisionOf(allowed, r.fromReply(c, req, allowed, rep.Now, wait)), Binding: rep.Binding, Wait: wait}
	if allowed {
		req.Dec.Took = 1
		req.Dec.Remaining = k.Remaining(tag, rep.Now)
		if rep.Clamped && req.Dec.Remaining > 1 { // one request a slot, as Status says
			req.Dec.Remaining = 1
		}
		req.Tags = append(req.Tags[:0], tag) // newMulti's arrays: no allocation
		req.Seqs = append(req.Seqs[:0], rep.Seq)
		req.At, req.Decided = rep.Now+wait, rep.Now
		if rep.Took {
			req.At = rep.Hole
		}
	}
	return nil
}

// fromReply returns an admitted reservation's delay as the shaper counts
// it, and sets the instant it counts from (req.Anchor); a refusal's wait
// unchanged.
//
// On the server's clock (the default), the slot decided+wait of the
// server's timeline is mapped onto the shaper's clock through one estimate
// of how far it runs ahead (skew.go), and counted from a reading taken
// after the reply: never before the slot on the server's timeline, and the
// slots of concurrent calls keep their spacing however late each reply is
// read. On the client clock (c.sent zero), wait counts from the instant the
// call decided at, less what the server ran after it (took: the delay
// counts from the reply), plus how late that instant was after the
// caller's (late: the delay counts from the caller's instant), never below
// 0.
func (r *backend) fromReply(c *reserveCall, req *store.Request, allowed bool, decided, wait float64) float64 {
	if !allowed {
		return wait
	}
	if !c.sent.IsZero() {
		replied := req.Dims[0].Clock.Now()
		req.Anchor = replied
		return r.skew.remoteDelay(c.sent, replied, decided, c.took, wait)
	}
	if c.took <= 0 && c.late <= 0 {
		return wait
	}
	return max(wait-c.took+c.late, 0)
}

// dimsArgs returns the ARGV of Reserve or Status for algs and costs (a
// deadline of limit ms caps the GCRA family's max_wait; with anyOf,
// algorithms.AnyWithin combines the dimensions).
func (r *backend) dimsArgs(algs []algorithms.Algorithm, costs []int64, now, limit float64, anyOf bool) []any {
	ldims := make([]script.Dim, len(algs))
	for i, a := range algs {
		kind, p := a.Params()
		if kind == "g" && limit < p[2] { // the caller's deadline: GCRA's max_wait
			p[2] = max(limit, 0)
		}
		ldims[i] = script.Dim{Kind: kind, Params: p, Cost: costs[i]}
	}
	args := script.ReserveArgs(r.now(now), ldims)
	if anyOf {
		args = append(args, script.Any)
	}
	return args
}

// decisionOf is the Decision of a transition a script made (or FailOpen's
// admission): admitted to depart after wait ms, or refused, wait ms past
// MaxQueue. The shaper reads no other field.
func decisionOf(allowed bool, wait float64) algorithms.Decision {
	if allowed {
		return algorithms.Decision{Allowed: true, Delay: algorithms.Duration(wait)}
	}
	return algorithms.Decision{RetryAfter: algorithms.Duration(wait)}
}
