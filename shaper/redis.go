package shaper

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/script"
)

// DefaultRedisTimeout bounds each Redis call unless WithRedisTimeout says otherwise.
const DefaultRedisTimeout = 250 * time.Millisecond

// redisRetryEvery is how long a store that saw Redis fail serves its failure
// policy before it tries Redis again.
const redisRetryEvery = 500 * time.Millisecond

// RedisStore keeps shaper state in Redis (single node, Sentinel or Cluster),
// so that every process using it shares one budget per key. Each reservation
// is one Lua script over all its keys, on Redis TIME by default, deciding
// exactly as the memory store does; its delay counts from the reply, so no
// caller departs before its slot. Keys never choose their cluster slot (see
// Dimension.Slot) and expire once equivalent to a cold key. When Redis is
// down or silent, the failure policy answers (WithFailurePolicy); a wrong
// password or permission, or a key holding foreign data, is an error under
// every policy. docs/REDIS.md gives the key layout and the failure rules.
type RedisStore struct {
	client      redis.UniversalClient
	ctxTimeouts bool // the client honours ctx deadlines on its sockets
	timeout     time.Duration
	clientClock bool
	coalescing  bool
	policy      FailurePolicy
	err         error
	slots       chan struct{} // one per call in flight: at most the client's pool size

	local   *MemoryStore // FailLocal
	handoff handoff      // FailLocal: local slots Redis has not seen yet

	health   *health
	degraded atomic.Uint64
	lanes    *lanes // nil: every reservation makes its own call (see coalesce.go)
}

// FailurePolicy says what a RedisStore does while Redis is down or silent.
type FailurePolicy struct {
	kind  int
	share float64
}

var (
	// FailClosed (the default) returns a *StoreError; nothing is admitted.
	FailClosed = FailurePolicy{kind: 0}
	// FailOpen admits every request, unpaced (see RedisStore.Degraded).
	FailOpen = FailurePolicy{kind: 1}
)

// FailLocal paces each process on its own at share (0 < share <= 1) of the
// rate: give each of N processes 1/N and the fleet stays within the contract.
func FailLocal(share float64) FailurePolicy { return FailurePolicy{kind: 2, share: share} }

// RedisOption configures NewRedisStore.
type RedisOption func(*RedisStore)

// WithTimeout is WithRedisTimeout.
//
// Deprecated: use WithRedisTimeout, whose name says whose option it is.
func WithTimeout(d time.Duration) RedisOption { return WithRedisTimeout(d) }

// WithRedisTimeout bounds each Redis call once it holds a connection
// (default DefaultRedisTimeout); waiting for a connection is bounded by the
// caller's ctx alone. A call past the bound while the server answers nobody
// is served by the failure policy; one past it while the server answers
// others fails alone with a *StoreError.
func WithRedisTimeout(d time.Duration) RedisOption {
	return func(r *RedisStore) {
		if d <= 0 {
			r.err = &ConfigError{Algorithm: "redis-store", Field: "Timeout", Value: d, Reason: "must be > 0"}
		}
		r.timeout = d
	}
}

// WithClientClock makes the scripts decide on the shaper's clock instead of
// Redis TIME (for tests; every host must then agree on the time).
func WithClientClock() RedisOption { return func(r *RedisStore) { r.clientClock = true } }

// WithCoalescing turns coalescing on (the default) or off. With it, a
// process keeps few calls in flight per hash slot (two under heavy load, up
// to eight while few callers overlap); the reservations it makes while they
// are in flight go together in the next call, one script execution that
// decides each in turn, with its own cost, slot, MaxQueue and deadline
// decision and its own error, exactly as its own call would have at that
// place in the sequence. A reservation that finds room goes at once, alone,
// so an idle process pays one round trip. Off, every reservation makes its
// own call. Coalescing applies to a *redis.Client (a single node, or
// Sentinel) and a *redis.ClusterClient (one batch per hash slot, never
// spanning two); a Ring or another client makes one call per reservation.
// docs/REDIS.md says more.
func WithCoalescing(on bool) RedisOption { return func(r *RedisStore) { r.coalescing = on } }

// WithFailurePolicy sets what the store does while Redis is down (default FailClosed).
func WithFailurePolicy(p FailurePolicy) RedisOption {
	return func(r *RedisStore) {
		if p.kind == 2 && !(p.share > 0 && p.share <= 1) {
			r.err = &ConfigError{Algorithm: "redis-store", Field: "FailLocal", Value: p.share, Reason: "share must be in (0, 1]"}
		}
		r.policy = p
	}
}

// NewRedisStore returns a store on client. A nil client or an invalid option
// is reported when a shaper is bound to the store (New or All).
func NewRedisStore(client redis.UniversalClient, opts ...RedisOption) *RedisStore {
	r := &RedisStore{client: client, timeout: DefaultRedisTimeout, health: newHealth(), coalescing: true}
	for _, o := range opts {
		o(r)
	}
	if client == nil && r.err == nil {
		r.err = &ConfigError{Algorithm: "redis-store", Field: "Client", Value: nil, Reason: "must not be nil"}
	}
	pool := 10 * runtime.GOMAXPROCS(0) // go-redis's default
	switch c := client.(type) {
	case *redis.Client:
		r.ctxTimeouts, pool = c.Options().ContextTimeoutEnabled, c.Options().PoolSize
	case *redis.ClusterClient:
		r.ctxTimeouts, pool = c.Options().ContextTimeoutEnabled, c.Options().PoolSize
	case *redis.Ring:
		pool = c.Options().PoolSize
	}
	r.slots = make(chan struct{}, max(pool, 1))
	if r.coalescing {
		r.lanes = newLanes(client)
	}
	if r.policy.kind == 2 {
		r.local = NewMemoryStore()
	}
	return r
}

// Close stops FailLocal's in-memory store; the caller owns and closes the client.
func (r *RedisStore) Close() error {
	if r.local != nil {
		return r.local.Close()
	}
	return nil
}

// Degraded returns how many operations the failure policy served instead of Redis.
func (r *RedisStore) Degraded() uint64 { return r.degraded.Load() }

// redisDim is the Redis store's data for one bound dimension (dim.bound).
type redisDim struct {
	params [2][3]any // the GCRA family: script.GCRAParams of alg and allow, formatted once
	twin   *dim      // FailLocal: the dimension at share of the rate, bound to the local store
}

// redisOf returns the Redis store's data for d, which it bound.
func redisOf(d *dim) *redisDim { return d.bound.(*redisDim) }

func (r *RedisStore) bind(d *dim) (any, error) {
	if r.err != nil {
		return nil, r.err
	}
	rd := newRedisDim(d)
	if r.local == nil {
		return rd, nil
	}
	twin, err := r.atShare(d, *d)
	if err != nil {
		return nil, err
	}
	twin.identity += " local"
	if twin.bound, err = r.local.bind(&twin); err != nil {
		return nil, err
	}
	rd.twin = &twin
	return rd, nil
}

// newRedisDim returns the Redis store's data for d, its twin aside: the
// GCRA family's parameters, formatted once.
func newRedisDim(d *dim) *redisDim {
	rd := &redisDim{}
	if d.kern != nil {
		_, p := d.alg.Params()
		_, pa := d.allow.Params()
		rd.params = [2][3]any{script.GCRAParams(p), script.GCRAParams(pa)}
	}
	return rd
}

// atShare returns twin, FailLocal's local twin of d (d itself at first),
// with d's algorithm at the policy's share of d's rate (a longer period).
func (r *RedisStore) atShare(d *dim, twin dim) (dim, error) {
	rate := d.rate
	rate.Period = time.Duration(float64(rate.Period) / r.policy.share)
	alg, allow, err := d.spec.build(rate, d.maxQueue)
	if err != nil {
		return dim{}, err
	}
	twin.alg, twin.allow, twin.rate, twin.maxQueue = alg, allow, rate, d.maxQueue
	twin.setKernels()
	return twin, nil
}

// twin returns d's FailLocal twin.
func (r *RedisStore) twin(d *dim) *dim { return redisOf(d).twin }

// escape makes s safe before and inside the hash tag: no "{" or "}"
// survives, and the mapping is one to one.
func escape(s string) string {
	if !strings.ContainsAny(s, `{}\`) {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `{`, `\(`, `}`, `\)`).Replace(s)
}

// escapeTag is escape for the hash tag, which must never be empty: Redis
// Cluster ignores "{}" and hashes the whole key, which would scatter the keys
// of one request over several slots. The empty tag is written `\e`, which
// escape never produces.
func escapeTag(s string) string {
	if s == "" {
		return `\e`
	}
	return escape(s)
}

// escapePart is escape for the parts after the hash tag, which ":"
// separates: ":" is escaped too, so that no part can end early.
func escapePart(s string) string {
	if !strings.ContainsAny(s, `{}\:`) {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `{`, `\(`, `}`, `\)`, `:`, `\;`).Replace(s)
}

// redisKeys returns, per dimension, the state key and the pause key. tag is
// the key whose slot they all live in. The mapping from (prefix, dimension,
// key, kind) to a Redis key is one to one (FuzzRedisKeysAreInjective):
//
//	one contract:   E(prefix) "{" T(key) "}"                     state
//	                E(prefix) "{" T(key) "}:p"                   pause
//	dimension name: E(prefix) "{" T(tag) "}" P(name) ":" P(key)  state
//	                E(prefix) "{" T(tag) "}" P(name) ":" P(key) ":p"  pause
//
// where E escapes "\", "{" and "}" (T is E, with "" written `\e` so that a
// tag is never empty), and P escapes ":" as well: the first "{" opens the
// tag, the first "}" after it closes it, a part after it never holds a raw
// ":", and a name is never empty. A key with a Ledger (see lua.Ledger) keeps
// it in the state key + ":l", ":h", ":b" and ":c", which the scripts derive: a
// command with more than ten arguments is refused, with the connection
// closed, before AUTH, so that the keys a reservation passes stay two.
func redisKeys(ks keyset) []string {
	keys, tag := ks.keys, ks.slot
	out := make([]string, 0, 2*len(ks.dims))
	for i, d := range ks.dims {
		var p string // the pause key; the state key is p without ":p" (one allocation for both)
		if d.name != "" {
			p = escape(d.base) + "{" + escapeTag(tag) + "}" + escapePart(d.name) + ":" + escapePart(keys[i]) + ":p"
		} else {
			p = escape(d.base) + "{" + escapeTag(tag) + "}:p"
		}
		out = append(out, p[:len(p)-2], p)
	}
	return out
}

// derivedSuffixes are the suffixes of the keys the scripts derive from a
// state key: its Ledger's (lua.Ledger) and a partner's clamp (lua.Clamp).
var derivedSuffixes = [...]string{":l", ":h", ":b", ":c", ":k"}

func (r *RedisStore) now(ms float64) string {
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
func (r *RedisStore) acquire(ctx context.Context, probe bool) error {
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
	case <-r.health.woken():
		return errJudgedDown
	case <-expired:
		return errBudget
	}
}

// budget is how long one call may hold its connection: the timeout, or,
// when a policy can serve the caller and its deadline is nearer, three
// quarters of the time left, so that the policy answers within the deadline.
func (r *RedisStore) budget(ctx context.Context) time.Duration {
	b := r.timeout
	if dl, ok := ctx.Deadline(); ok && r.policy.kind != 0 {
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
func (r *RedisStore) call(ctx context.Context, probe bool, f func(context.Context) error) error {
	replies := r.health.replies.Load()
	if err := r.acquire(ctx, probe); err != nil {
		if errors.Is(err, errBudget) { // the probe found every connection held for the timeout
			return r.timedOut(replies, r.timeout, probe)
		}
		return err
	}
	replies = r.health.replies.Load()
	budget := r.budget(ctx)
	cctx, cancel := context.WithTimeoutCause(ctx, budget, errBudget)
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
	if err != nil && callerDone(ctx) == nil && (cctx.Err() != nil || classify(err) == failTimeout) {
		return r.timedOut(replies, budget, probe)
	}
	var reply redis.Error
	switch {
	case err == nil:
		r.health.answered()
	case callerDone(ctx) != nil:
		// the caller left: this says nothing of the server
	case classify(err) == failDown:
		// A server that refused this client's credentials closes the
		// connection of a command it refused before AUTH ("unauthenticated
		// multibulk"): the next call on it finds it closed. That is the same
		// refusal, not an outage the policy may serve.
		if refused := r.health.refusal(); refused != nil {
			return refused
		}
		r.health.down()
	case errors.As(err, &reply):
		r.health.answered()
		if classify(err) == failConfig {
			r.health.refused(err)
		}
	}
	return err
}

// timedOut judges a call that waited for waited and ran out of time, the
// server's replies having been counted at replies when it began. If the
// server answered other calls meanwhile it is up and this process is slow
// (errBudget: the call fails alone). If it answered nobody (errSilent) the
// policy serves the call, and the server is judged down when the silence
// lasted at least half the timeout, or at once when the call was the probe
// of a server already judged down.
func (r *RedisStore) timedOut(replies uint64, waited time.Duration, probe bool) error {
	if !r.health.silentSince(replies) {
		return errBudget
	}
	if probe || waited >= r.timeout/2 {
		r.health.down()
	}
	return errSilent
}

// degrade counts an operation served by the policy.
func (r *RedisStore) degrade(ctx context.Context, op string) {
	r.degraded.Add(1)
	traceDegraded(ctx, op)
}

func (r *RedisStore) reserveAll(ctx context.Context, req *multi) error {
	try, probe := r.health.admit()
	if !try {
		return r.serve(ctx, req, errJudgedDown)
	}
	if probe {
		defer r.health.probing.Store(false)
	}
	err := r.reserveRedis(ctx, probe, req)
	if err == nil {
		return nil
	}
	if err := callerDone(ctx); err != nil { // the caller gave up or ran out of time: its error, unchanged
		return err
	}
	switch classify(err) {
	case failData:
		return stateError("reserve", err, req.dims, req.keys)
	case failCost:
		i := 0
		if _, rest, ok := strings.Cut(err.Error(), "TKCOST "); ok {
			if n, convErr := strconv.Atoi(strings.Fields(rest)[0]); convErr == nil && n >= 0 && n < len(req.dims) {
				i = n
			}
		}
		return &CostError{Algorithm: req.algs[i].Name(), Cost: req.costs[i], Key: req.keys[i], Dimension: req.dims[i].name,
			Reason: "refused by the Redis script (the library and the script disagree: different versions?)"}
	case failDown, failTimeout:
		return r.serve(ctx, req, err)
	}
	return &StoreError{Op: "reserve", Err: err}
}

// serve answers a reservation that Redis could not serve because it is down
// or did not answer in time: FailClosed returns a *StoreError, FailOpen
// admits at once, FailLocal reserves on the local store at a share of the
// rate, at the clock's now (the call may have taken the whole timeout).
func (r *RedisStore) serve(ctx context.Context, req *multi, cause error) error {
	if r.policy.kind == 0 {
		return &StoreError{Op: "reserve", Err: cause}
	}
	r.degrade(ctx, "reserve")
	req.local = true
	if r.policy.kind == 1 { // FailOpen: nothing to refund
		req.dec = algorithms.AllDecision{Decision: decisionOf(true, 0), Took: 1<<len(req.dims) - 1}
		req.tags = nil
		return nil
	}
	local := *req
	local.now = algorithms.Millis(req.dims[0].clock.Now())
	local.dims = make([]*dim, len(req.dims))
	local.algs = make([]algorithms.Algorithm, len(req.dims))
	for i, d := range req.dims {
		local.dims[i] = r.twin(d)
		local.algs[i] = local.dims[i].alg
		if req.algs[i] == d.allow {
			local.algs[i] = local.dims[i].allow
		}
	}
	if err := r.local.reserveAll(ctx, &local); err != nil {
		return err
	}
	req.dec, req.tags, req.gens, req.seqs, req.at = local.dec, local.tags, local.gens, local.seqs, local.at
	if req.dec.Allowed && len(req.dims) == 1 && req.dims[0].kern != nil && len(req.tags) == 1 {
		r.handoff.granted(req.dims[0], req.keys[0], req.tags[0])
	}
	return nil
}

// reserveRedis decides req on Redis: through the lane of its hash slot
// when the store coalesces (see coalesce.go), else with a call of its own.
func (r *RedisStore) reserveRedis(ctx context.Context, probe bool, req *multi) error {
	if r.lanes != nil && !probe && (r.local == nil || !r.handoff.pending()) {
		return r.coalesce(ctx, req)
	}
	return r.reserveAlone(ctx, probe, req)
}

// reserveAlone decides req with one call of its own.
func (r *RedisStore) reserveAlone(ctx context.Context, probe bool, req *multi) error {
	var c reserveCall
	r.prepare(&c, req)
	return r.callAlone(ctx, probe, &c, req)
}

// callAlone runs req's call c, prepared, by itself.
func (r *RedisStore) callAlone(ctx context.Context, probe bool, c *reserveCall, req *multi) error {
	var v any
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
// Under FailLocal a call of ReserveGCRA also hands the schedule over between
// Redis and the local store (see handoff): a key whose local slots Redis has
// not seen passes their end as a TAT floor, and every admission seeds the
// local twin with Redis's TAT (finish), so that whichever serves next
// continues the schedule instead of starting a new one beside it.
func (r *RedisStore) prepare(c *reserveCall, req *multi) {
	c.keys = redisKeys(req.keyset)
	d := req.dims[0]
	if len(req.dims) != 1 || d.kern == nil {
		c.args = r.dimsArgs(req.algs, req.costs, req.now, req.limit, req.any)
		return
	}
	rd := redisOf(d)
	params, k := &rd.params[0], d.kern
	if req.algs[0] == d.allow {
		params, k = &rd.params[1], d.kernAllow
	}
	c.args = script.ReserveGCRAArgs(r.now(req.now), params, req.costs[0])
	if req.limit < k.MaxWait { // the caller's deadline comes first: the script waits no longer
		within := *k
		within.MaxWait = max(req.limit, 0)
		k = &within
		c.args[3] = script.Float(k.MaxWait)
	}
	c.gcra = k
	if r.local != nil && r.handoff.pending() {
		if c.floor = r.handoff.floor(d, req.keys[0], algorithms.Millis(d.clock.Now())); c.floor > 0 {
			c.args = append(c.args, script.Float(c.floor))
		}
	}
}

// finish reads the reply v of req's call c into req. ReserveGCRA replies
// with the inputs of its transition; the figures are recomputed here with
// the same math.
func (r *RedisStore) finish(c *reserveCall, req *multi, v any) error {
	if c.gcra == nil {
		rep, err := script.ParseReserve(v, len(req.dims))
		if err != nil {
			return err
		}
		req.dec = algorithms.AllDecision{Decision: decisionOf(rep.Allowed, c.fromReply(rep.Allowed, rep.Wait)), Binding: rep.Binding, Wait: rep.Wait, Took: rep.Took}
		req.dec.Remaining = gcra.Units(rep.Remaining)
		req.tags, req.seqs = rep.Tags, rep.Seqs
		req.at = rep.Now + rep.Wait // as the script computed it
		return nil
	}
	d, k := req.dims[0], c.gcra
	rep, err := script.ParseReserveGCRA(v, req.now+c.late)
	if err != nil {
		return err
	}
	rep.Handoff = c.floor
	allowed, wait, tag, err := rep.Decide(k, req.costs[0])
	if err != nil {
		return err
	}
	req.dec = algorithms.AllDecision{Decision: decisionOf(allowed, c.fromReply(allowed, wait)), Binding: rep.Binding, Wait: wait}
	if allowed {
		req.dec.Took = 1
		req.dec.Remaining = k.Remaining(tag, rep.Now)
		if rep.Clamped && req.dec.Remaining > 1 { // one request a slot, as Status says
			req.dec.Remaining = 1
		}
		req.tags = append(req.tags[:0], tag) // newMulti's arrays: no allocation
		req.seqs = append(req.seqs[:0], rep.Seq)
		req.at = rep.Now + wait
		if rep.Took {
			req.at = rep.Hole
		}
		if r.local != nil {
			// Redis's TAT on this process's clock, read after the reply: later
			// than on the server's, so the local schedule never starts early.
			local := algorithms.Millis(d.clock.Now())
			r.local.seedTAT(r.twin(d), req.keys[0], local+(tag-rep.Now), local)
			if c.floor > 0 {
				r.handoff.done(d, req.keys[0])
			}
		}
	}
	return nil
}

// fromReply returns an admitted reservation's delay as the shaper counts
// it: wait, counted from the instant the call decided at, less what the
// server ran after it (took: the delay counts from the reply), plus how
// late that instant was after the caller's (late: on the client clock the
// delay counts from the caller's instant), never below 0; a refusal's wait
// unchanged.
func (c *reserveCall) fromReply(allowed bool, wait float64) float64 {
	if !allowed || c.took <= 0 && c.late <= 0 {
		return wait
	}
	return max(wait-c.took+c.late, 0)
}

// dimsArgs returns the ARGV of Reserve or Status for algs and costs (a
// deadline of limit ms caps the GCRA family's max_wait; with anyOf,
// algorithms.AnyWithin combines the dimensions).
func (r *RedisStore) dimsArgs(algs []algorithms.Algorithm, costs []int64, now, limit float64, anyOf bool) []any {
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

func (r *RedisStore) settle(ctx context.Context, st *settlement) error {
	if st.local { // a slot the policy granted: the local store gives it back (FailOpen granted nothing)
		if r.local == nil || st.tags == nil || len(st.gens) != len(st.tags) {
			return nil
		}
		local := *st
		local.keyset = r.twins(st.keyset)
		return r.local.settle(ctx, &local)
	}
	var rk []string
	sent := keyset{slot: st.slot} // the dimensions sent, in the script's order: its errors name them by index
	args := []any{r.now(st.now), script.Float(st.at), "0"}
	if st.holes {
		args[2] = "1"
	}
	all := redisKeys(st.keyset)
	for i, d := range st.dims {
		actual := int64(-1)
		if st.actual != nil {
			actual = st.actual[i]
		}
		if d.kern == nil && actual <= st.costs[i] { // the other algorithms only take an extra
			continue
		}
		rk = append(rk, all[2*i])
		sent.dims, sent.keys = append(sent.dims, d), append(sent.keys, st.keys[i])
		kind, p := d.alg.Params()
		args = append(args, kind)
		for _, x := range p {
			args = append(args, script.Float(x))
		}
		args = append(args, script.Float(st.tags[i]), script.Float(st.seqs[i]), strconv.FormatInt(st.costs[i], 10), strconv.FormatInt(actual, 10))
	}
	if len(rk) == 0 {
		return nil
	}
	return r.write(ctx, "settle", sent, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error { return script.Settle.Run(ctx, r.client, rk, args...).Err() })
	})
}

func (r *RedisStore) pause(ctx context.Context, ks keyset, now, d float64) error {
	all := redisKeys(ks)
	pk := make([]string, len(ks.dims))
	for i := range ks.dims {
		pk[i] = all[2*i+1]
	}
	err := r.write(ctx, "pause", ks, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error {
			return script.Pause.Run(ctx, r.client, pk, r.now(now), script.Float(d)).Err()
		})
	})
	if r.local != nil && !errors.Is(err, ErrInvalidState) { // the local fallback honours the pause too
		_ = r.local.pause(ctx, r.twins(ks), now, d)
	}
	return err
}

func (r *RedisStore) reset(ctx context.Context, ks keyset) error {
	all := redisKeys(ks)
	for i := range ks.dims {
		for _, suffix := range derivedSuffixes {
			all = append(all, all[2*i]+suffix)
		}
	}
	return r.write(ctx, "reset", ks, func(ctx context.Context, probe bool) error {
		return r.call(ctx, probe, func(ctx context.Context) error { return r.client.Del(ctx, all...).Err() })
	})
}

// write runs a write that has no local fallback. While Redis is judged
// down it is not sent (only a probe goes to Redis). A failure that the
// policy may serve (Redis down or silent) is returned as a *StoreError
// under FailClosed, and counted and ignored under FailOpen and FailLocal;
// every other failure is returned.
func (r *RedisStore) write(ctx context.Context, op string, ks keyset, f func(ctx context.Context, probe bool) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := errJudgedDown
	if try, probe := r.health.admit(); try {
		if probe {
			defer r.health.probing.Store(false)
		}
		if err = f(ctx, probe); err == nil {
			return nil
		}
		if e := callerDone(ctx); e != nil {
			return e
		}
	}
	switch classify(err) {
	case failData:
		return stateError(op, err, ks.dims, ks.keys)
	case failDown, failTimeout:
		if r.policy.kind == 0 {
			return &StoreError{Op: op, Err: err}
		}
		r.degrade(ctx, op)
		return nil
	}
	return &StoreError{Op: op, Err: err}
}

// pauseLeft reads the pause keys' TTLs: a pause key lives exactly as long as
// its pause, on the server's clock, so no clock is compared. One round trip
// (PTTL for one key, a pipeline for several).
//
// While Redis is judged down it is not asked: the FailLocal store answers
// for its mirrored pauses, the other policies report the outage, and Wait
// departs on its granted slot. Otherwise every request that slept would
// spend the store's timeout here during an outage.
func (r *RedisStore) pauseLeft(ctx context.Context, ks keyset, now float64) (float64, error) {
	try, probe := r.health.admit()
	if !try {
		return r.localPauseLeft(ctx, ks, now)
	}
	if probe {
		defer r.health.probing.Store(false)
	}
	all := redisKeys(ks)
	left := 0.0
	err := r.call(ctx, probe, func(ctx context.Context) error {
		cmds, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range ks.dims {
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
	if err != nil { // f may still run (see call): do not read left
		if e := callerDone(ctx); e != nil {
			return 0, e
		}
		if c := classify(err); c == failDown || c == failTimeout {
			return r.localPauseLeft(ctx, ks, now)
		}
		return 0, &StoreError{Op: "pause_left", Err: err}
	}
	return left, nil
}

// status reads the keys' standing with one read-only script call. While
// Redis is down or silent, FailLocal answers from its local store (what it
// would grant); the other policies report the outage: there is no shared
// figure to give.
func (r *RedisStore) status(ctx context.Context, q *query) error {
	try, probe := r.health.admit()
	if !try {
		return r.localStatus(ctx, q, errJudgedDown)
	}
	if probe {
		defer r.health.probing.Store(false)
	}
	keys, args := redisKeys(q.keyset), r.dimsArgs(q.algs, q.costs, q.now, noLimit, q.any)
	var v any
	err := r.call(ctx, probe, func(ctx context.Context) error {
		var err error
		v, err = script.Status.Run(ctx, r.client, keys, args...).Result()
		return err
	})
	if err != nil {
		if e := callerDone(ctx); e != nil {
			return e
		}
		switch classify(err) {
		case failData:
			return stateError("status", err, q.dims, q.keys)
		case failDown, failTimeout:
			return r.localStatus(ctx, q, err)
		}
		return &StoreError{Op: "status", Err: err}
	}
	rep, err := script.ParseStatus(v, len(q.dims))
	if err != nil {
		return &StoreError{Op: "status", Err: err}
	}
	q.at, q.until, q.binding, q.figures = rep.Now, rep.Until, rep.Binding, rep.Dims
	return nil
}

// localStatus answers status while Redis is down: FailLocal's local store,
// or the outage.
func (r *RedisStore) localStatus(ctx context.Context, q *query, cause error) error {
	if r.local == nil {
		return &StoreError{Op: "status", Err: cause}
	}
	local := *q
	local.keyset = r.twins(q.keyset)
	local.algs = make([]algorithms.Algorithm, len(q.dims))
	for i, d := range local.dims {
		local.algs[i] = d.alg
	}
	local.now = algorithms.Millis(q.dims[0].clock.Now())
	if err := r.local.status(ctx, &local); err != nil {
		return err
	}
	q.at, q.until, q.binding, q.figures = local.at, local.until, local.binding, local.figures
	return nil
}

// localPauseLeft answers pauseLeft while Redis is down.
func (r *RedisStore) localPauseLeft(ctx context.Context, ks keyset, now float64) (float64, error) {
	if r.local == nil {
		return 0, &StoreError{Op: "pause_left", Err: errJudgedDown}
	}
	return r.local.pauseLeft(ctx, r.twins(ks), now)
}

// twins returns ks on the local store's twin of each dimension (see twin).
func (r *RedisStore) twins(ks keyset) keyset {
	out := make([]*dim, len(ks.dims))
	for i, d := range ks.dims {
		out[i] = r.twin(d)
	}
	ks.dims = out
	return ks
}

// handoff keeps, per key, the end of the slots the FailLocal policy granted
// while Redis was down (a TAT on this process's clock). Redis never saw
// them: until it has admitted a reservation for the key, each reservation
// passes how far ahead they run as a TAT floor, so that Redis's schedule
// continues after the local one instead of beside it. One-dimension shapers
// of the GCRA family (the leaky bucket and GCRA) hand over; other shapers
// start a new schedule on each side of an outage (docs/RELIABILITY.md).
type handoff struct {
	n  atomic.Int64 // len(m), so that the common case takes no lock
	mu sync.Mutex
	m  map[handoffKey]float64
}

type handoffKey struct {
	d   *dim
	key string
}

// granted records a local slot whose reservation stored tat.
func (h *handoff) granted(d *dim, key string, tat float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[handoffKey]float64{}
	}
	k := handoffKey{d, key}
	if cur, ok := h.m[k]; !ok || tat > cur {
		if !ok {
			k.key = strings.Clone(key)
			h.n.Add(1)
		}
		h.m[k] = tat
	}
}

// pending reports whether any local slot awaits handing over (one atomic
// load: the common case, Redis up for a while, reads no clock and takes no
// lock).
func (h *handoff) pending() bool { return h.n.Load() > 0 }

// floor returns how far ahead of now (ms) the local slots of key run, 0 if
// they have passed or there are none; a passed entry is dropped.
func (h *handoff) floor(d *dim, key string, now float64) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := handoffKey{d, key}
	tat, ok := h.m[k]
	if !ok {
		return 0
	}
	if tat <= now {
		delete(h.m, k)
		h.n.Add(-1)
		return 0
	}
	return tat - now
}

// done forgets key's local slots: Redis has admitted a reservation after them.
func (h *handoff) done(d *dim, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.m[handoffKey{d, key}]; ok {
		delete(h.m, handoffKey{d, key})
		h.n.Add(-1)
	}
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
