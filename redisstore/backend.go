package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/redisstore/internal/health"
)

// backend is the store contract on Redis alone: every operation is one
// call through the same skeleton (do). What to do while Redis is down is
// the failure policy's, a decorator around it (failover.go).
type backend struct {
	client      redis.UniversalClient
	ctxTimeouts bool // the client honours ctx deadlines on its sockets
	timeout     time.Duration
	clientClock bool
	served      bool // a failure policy serves what Redis cannot (see budget)
	err         error
	slots       chan struct{} // one per call in flight: at most the client's pool size
	health      *health.Tracker
	lanes       *lanes      // nil: every reservation makes its own call (see coalesce.go)
	permits     permitState // the leases held and renewed, the release notices (permits.go)
	skew        skew        // the server's timeline on the shaper's clock (skew.go)
}

var _ store.Backend = (*backend)(nil)

// redisDim is the Redis store's data for one bound dimension (Dim.Bound).
type redisDim struct {
	params [2][3]any  // the GCRA family: script.GCRAParams of Alg and Allow, formatted once
	twin   *store.Dim // FailLocal: the dimension at share of the rate, bound to the local store
}

// redisOf returns the Redis store's data for d, which it bound.
func redisOf(d *store.Dim) *redisDim { return d.Bound.(*redisDim) }

// Bind formats d's parameters for the scripts, once.
func (r *backend) Bind(d *store.Dim) (any, error) {
	if r.err != nil {
		return nil, r.err
	}
	rd := &redisDim{}
	if d.Kern != nil {
		_, p := d.Alg.Params()
		_, pa := d.Allow.Params()
		rd.params = [2][3]any{script.GCRAParams(p), script.GCRAParams(pa)}
	}
	return rd, nil
}

// Rebind is Bind: the scripts read the contract from their arguments.
func (r *backend) Rebind(d *store.Dim) (any, error) { return r.Bind(d) }

// Remote is true unless the scripts decide on the shaper's clock
// (WithClientClock).
func (r *backend) Remote() bool { return !r.clientClock }

// Watch is nil: a shaper reads the fleet's record every refresh interval.
func (r *backend) Watch(string) *atomic.Uint64 { return nil }

// do is every operation's skeleton: the health tracker admits the call (or
// only its probe, while Redis is judged down), f makes it through call,
// and a failure is classified (fail).
func (r *backend) do(ctx context.Context, op string, ks store.KeySet, req *store.Request, f func(ctx context.Context, probe bool) error) error {
	pass := r.health.Admit()
	defer r.health.Done(pass)
	err := health.ErrJudgedDown
	if pass.Try {
		if err = f(ctx, pass.Probe); err == nil {
			return nil
		}
	}
	return r.fail(ctx, op, ks, req, err)
}

// fail is the error of operation op on ks that failed with err: the
// caller's own ctx error, unchanged, when it left; a *StateError for a key
// holding data the store did not write; a *CostError for a cost the script
// refused (a reservation, req); otherwise an *Error, marked as an outage
// when Redis is down or silent, which a failure policy may serve.
func (r *backend) fail(ctx context.Context, op string, ks store.KeySet, req *store.Request, err error) error {
	if e := callerDone(ctx); e != nil {
		return e
	}
	switch health.Classify(err) {
	case health.Data:
		return stateError(op, err, ks.Dims, ks.Keys)
	case health.Cost:
		if req != nil {
			return costError(err, req)
		}
	case health.Down, health.Timeout:
		return &Error{Op: op, Err: err, outage: true}
	}
	return &Error{Op: op, Err: err}
}

// costError is the *CostError of a reservation whose cost the script
// refused ("TKCOST <dimension index> ...").
func costError(err error, req *store.Request) error {
	i := 0
	if _, rest, ok := strings.Cut(err.Error(), "TKCOST "); ok {
		if n, convErr := strconv.Atoi(strings.Fields(rest)[0]); convErr == nil && n >= 0 && n < len(req.Dims) {
			i = n
		}
	}
	return &algorithms.CostError{Algorithm: req.Algs[i].Name(), Cost: req.Costs[i], Key: req.Keys[i], Dimension: req.Dims[i].Name,
		Reason: "refused by the Redis script (the library and the script disagree: different versions?)"}
}

// stateError builds the error for a TKSTATE reply: "TKSTATE <dimension
// index> <reason>", naming the user's key and the dimension.
func stateError(op string, err error, dims []*store.Dim, keys []string) error {
	msg := err.Error()
	idx, reason := 0, msg
	if rest, ok := strings.CutPrefix(msg, "TKSTATE "); ok {
		n, why, _ := strings.Cut(rest, " ")
		if i, convErr := strconv.Atoi(n); convErr == nil && i >= 0 && i < len(dims) {
			idx, reason = i, why
		}
	} else if strings.HasPrefix(msg, "WRONGTYPE") {
		reason = "holds a value of another type"
	}
	if len(dims) == 0 {
		return &StateError{Op: op, Reason: reason, Err: err}
	}
	return &StateError{Op: op, Key: keys[idx], Dimension: dims[idx].Name, Reason: reason, Err: err}
}

func (r *backend) now(ms float64) string {
	if r.clientClock {
		return script.Float(ms)
	}
	return script.ServerTime
}

// callerDone returns the caller's ctx error, or context.DeadlineExceeded if
// its deadline has passed but its timer has not yet fired (a socket deadline
// set from the same instant can trip first).
func callerDone(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// acquire waits for a call slot (the store runs at most the client's pool
// size of calls at once, so that its calls never queue inside the client on
// the timeout's clock). The wait is bounded by the caller's ctx, not by the
// timeout: a burst of callers on a healthy server is not an outage. A caller
// waiting when the server is judged down is released at once; the probe
// waits at most the timeout.
func (r *backend) acquire(ctx context.Context, probe bool) error {
	select {
	case r.slots <- struct{}{}:
		return nil
	default:
	}
	var expired <-chan time.Time
	if probe {
		t := time.NewTimer(r.timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case r.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.health.Woken():
		return health.ErrJudgedDown
	case <-expired:
		return health.ErrBudget
	}
}

// budget is how long one call may hold its connection: the timeout, or,
// when a failure policy can serve the caller and its deadline is nearer, three
// quarters of the time left, so that the policy answers within the deadline.
func (r *backend) budget(ctx context.Context) time.Duration {
	b := r.timeout
	if dl, ok := ctx.Deadline(); ok && r.served {
		if left := time.Until(dl) * 3 / 4; left < b {
			b = max(left, 0)
		}
	}
	return b
}

// call runs f on Redis within the call's budget and records what the
// outcome says of the server's health: any answer means it is up; a
// connection failure, an unhealthy reply, or a timeout during which the
// server answered nobody for half the timeout means it is down. go-redis
// applies a ctx deadline to its socket only with ContextTimeoutEnabled; for
// other clients f runs on its own goroutine, which keeps its call slot until
// the client's own timeout ends it.
func (r *backend) call(ctx context.Context, probe bool, f func(context.Context) error) error {
	replies := r.health.Replies()
	if err := r.acquire(ctx, probe); err != nil {
		if errors.Is(err, health.ErrBudget) { // the probe found every connection held for the timeout
			return r.health.TimedOut(replies, r.timeout, probe)
		}
		return err
	}
	replies = r.health.Replies()
	budget := r.budget(ctx)
	cctx, cancel := context.WithTimeoutCause(ctx, budget, health.ErrBudget)
	defer cancel()
	var err error
	if r.ctxTimeouts {
		err = f(cctx)
		<-r.slots
	} else {
		done := make(chan error, 1)
		go func() {
			e := f(cctx)
			<-r.slots
			done <- e
		}()
		select {
		case err = <-done:
		case <-cctx.Done():
			err = context.Cause(cctx)
		}
	}
	// The budget ran out, whatever form the client gave it: the ctx's error,
	// or a socket deadline (set from the same instant) that tripped first.
	// callerDone, not ctx.Err: the caller's own deadline can trip the socket
	// a moment before its ctx reports it, and says nothing of the server.
	if err != nil && callerDone(ctx) == nil && (cctx.Err() != nil || health.Classify(err) == health.Timeout) {
		return r.health.TimedOut(replies, budget, probe)
	}
	var reply redis.Error
	switch {
	case err == nil:
		r.health.Answered()
	case callerDone(ctx) != nil:
		// the caller left: this says nothing of the server
	case health.Classify(err) == health.Down:
		// A server that refused this client's credentials closes the
		// connection of a command it refused before AUTH ("unauthenticated
		// multibulk"): the next call on it finds it closed. That is the same
		// refusal, not an outage the policy may serve.
		if refused := r.health.Refusal(); refused != nil {
			return refused
		}
		r.health.Down()
	case errors.As(err, &reply):
		r.health.Answered()
		if health.Classify(err) == health.Config {
			r.health.Refused(err)
		}
	}
	return err
}
