package shaper

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/lua"
)

// DefaultRedisTimeout bounds every Redis call unless WithTimeout says otherwise.
const DefaultRedisTimeout = 250 * time.Millisecond

// redisRetryEvery is how long a store that saw Redis fail serves its failure
// policy before it tries Redis again.
const redisRetryEvery = 500 * time.Millisecond

// RedisStore keeps shaper state in Redis, so that every process sharing the
// server (single node, Sentinel or Cluster: any redis.UniversalClient) shares
// one budget per key.
//
// Every reservation is one round trip: one Lua script (EVALSHA, EVAL when the
// server answers NOSCRIPT) that computes the same transition as the memory
// store, bit for bit, over all of the reservation's keys at once. By default
// the script reads Redis TIME, so hosts whose clocks disagree still share one
// schedule; WithClientClock passes the shaper's clock instead.
//
// Keys are the shaper's prefix followed by the escaped key in braces, so that
// no key can choose its cluster slot: "{", "}" and "\" are escaped in both. A
// multi-dimension reservation keeps all its keys in the slot of its first
// dimension's key: put the broadest dimension (the account) first. Every key
// expires once its state is equivalent to a cold key.
//
// When Redis fails or times out, the failure policy decides (WithFailurePolicy):
// FailClosed (the default) returns a *StoreError, FailOpen admits, FailLocal
// paces on an in-memory shaper at a share of the rate. After a failure the
// store serves the policy for half a second before it tries Redis again.
type RedisStore struct {
	client      redis.UniversalClient
	ctxTimeouts bool // the client honours ctx deadlines on its sockets
	timeout     time.Duration
	clientClock bool
	policy      FailurePolicy
	err         error

	local    *MemoryStore // FailLocal
	localMu  sync.Mutex
	localFor map[*dim]*dim // each bound dimension's scaled local twin

	downUntil atomic.Int64 // unix ns until which Redis is not tried
	degraded  atomic.Uint64
}

// FailurePolicy says what a RedisStore does when Redis fails or times out.
type FailurePolicy struct {
	kind  int
	share float64
}

var (
	// FailClosed returns the error, wrapped in a *StoreError matching
	// ErrStoreUnavailable. Nothing is admitted. This is the default.
	FailClosed = FailurePolicy{kind: 0}
	// FailOpen admits every request while Redis is unavailable (and counts it:
	// see Degraded). The contract is not enforced meanwhile.
	FailOpen = FailurePolicy{kind: 1}
)

// FailLocal paces requests on an in-memory shaper at share (0 < share <= 1)
// of the rate while Redis is unavailable: give each of N processes 1/N so that
// the fleet stays within the contract.
func FailLocal(share float64) FailurePolicy { return FailurePolicy{kind: 2, share: share} }

// RedisOption configures NewRedisStore.
type RedisOption func(*RedisStore)

// WithTimeout bounds each Redis call (default DefaultRedisTimeout); past it the
// failure policy serves the call. A client created with ContextTimeoutEnabled
// applies the bound on its socket; for any other client the store enforces it
// by running the call on its own goroutine (about a microsecond more per call,
// and a stalled call's goroutine lives until the client's ReadTimeout).
func WithTimeout(d time.Duration) RedisOption {
	return func(r *RedisStore) {
		if d <= 0 {
			r.err = &ConfigError{Algorithm: "redis-store", Field: "Timeout", Value: d, Reason: "must be > 0"}
		}
		r.timeout = d
	}
}

// WithClientClock makes the scripts use the shaper's clock instead of Redis
// TIME (for tests and conformance; every host must then agree on the time).
func WithClientClock() RedisOption { return func(r *RedisStore) { r.clientClock = true } }

// WithFailurePolicy sets what happens while Redis is unavailable.
func WithFailurePolicy(p FailurePolicy) RedisOption {
	return func(r *RedisStore) {
		if p.kind == 2 && !(p.share > 0 && p.share <= 1) {
			r.err = &ConfigError{Algorithm: "redis-store", Field: "FailLocal", Value: p.share, Reason: "share must be in (0, 1]"}
		}
		r.policy = p
	}
}

// NewRedisStore returns a store on client. A nil client or an invalid option
// is reported by New or All when a shaper is bound to the store.
func NewRedisStore(client redis.UniversalClient, opts ...RedisOption) *RedisStore {
	r := &RedisStore{client: client, timeout: DefaultRedisTimeout, localFor: map[*dim]*dim{}}
	for _, o := range opts {
		o(r)
	}
	if client == nil && r.err == nil {
		r.err = &ConfigError{Algorithm: "redis-store", Field: "Client", Value: nil, Reason: "must not be nil"}
	}
	switch c := client.(type) {
	case *redis.Client:
		r.ctxTimeouts = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		r.ctxTimeouts = c.Options().ContextTimeoutEnabled
	}
	if r.policy.kind == 2 {
		r.local = NewMemoryStore()
	}
	return r
}

// Close stops the FailLocal policy's in-memory store; it does not close the
// Redis client, which the caller owns.
func (r *RedisStore) Close() error {
	if r.local != nil {
		return r.local.Close()
	}
	return nil
}

// Degraded returns how many operations were served by the failure policy
// (FailOpen or FailLocal) instead of Redis.
func (r *RedisStore) Degraded() uint64 { return r.degraded.Load() }

func (r *RedisStore) bind(d *dim) error {
	if r.err != nil {
		return r.err
	}
	if d.gcra != nil {
		_, p := d.alg.Params()
		_, pa := d.allow.Params()
		d.luaGCRA = [2][3]any{lua.GCRAParams(p), lua.GCRAParams(pa)}
	}
	if r.local == nil {
		return nil
	}
	// The local twin: the same algorithm at share of the rate (a longer period).
	rate := d.rate
	rate.Period = time.Duration(float64(rate.Period) / r.policy.share)
	alg, allow, err := d.spec.build(rate, d.maxQueue)
	if err != nil {
		return err
	}
	twin := *d
	twin.alg, twin.allow, twin.rate = alg, allow, rate
	twin.gcra, _ = alg.(*algorithms.GCRA)
	twin.identity += " local"
	if err := r.local.bind(&twin); err != nil {
		return err
	}
	r.localMu.Lock()
	r.localFor[d] = &twin
	r.localMu.Unlock()
	return nil
}

func (r *RedisStore) twin(d *dim) *dim {
	r.localMu.Lock()
	defer r.localMu.Unlock()
	return r.localFor[d]
}

// escape makes s safe inside a key: no "{" or "}" survives, and the mapping
// is one to one.
func escape(s string) string {
	if !strings.ContainsAny(s, `{}\`) {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `{`, `\(`, `}`, `\)`).Replace(s)
}

// redisKeys returns, per dimension, the state key and the pause key. tag is
// the key whose slot they all live in.
func redisKeys(dims []*dim, keys []string, tag string) []string {
	out := make([]string, 0, 2*len(dims))
	for i, d := range dims {
		var p string // the pause key; the state key is p without ":p" (one allocation for both)
		if d.name != "" {
			p = escape(d.base) + "{" + escape(tag) + "}" + escape(d.name) + ":" + escape(keys[i]) + ":p"
		} else {
			p = escape(d.base) + "{" + escape(tag) + "}:p"
		}
		out = append(out, p[:len(p)-2], p)
	}
	return out
}

func (r *RedisStore) now(ms float64) string {
	if r.clientClock {
		return lua.Float(ms)
	}
	return lua.ServerTime
}

// available reports whether Redis should be tried now.
func (r *RedisStore) available() bool { return time.Now().UnixNano() >= r.downUntil.Load() }

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

// failed records a Redis failure (the caller's ctx is still live) and
// returns whether the policy serves the call.
func (r *RedisStore) failed(error) bool {
	r.downUntil.Store(time.Now().Add(redisRetryEvery).UnixNano())
	return r.policy.kind != 0
}

// call runs f under the store's timeout. go-redis applies a ctx deadline to
// its socket only with ContextTimeoutEnabled; without it a stalled server
// holds a call for the client's ReadTimeout (3 s by default), and the failure
// policy would not be served in time. So for such clients (and client types
// whose options are unknown) f runs on its own goroutine and call returns at
// the deadline; the goroutine ends when the client's own timeout does.
func (r *RedisStore) call(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if r.ctxTimeouts {
		return f(ctx)
	}
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *RedisStore) reserve(ctx context.Context, d *dim, alg algorithms.Algorithm, key string, cost int64, now float64) (algorithms.Decision, float64, error) {
	req := newMulti(1, now)
	req.dims, req.algs, req.keys, req.costs = append(req.dims, d), append(req.algs, alg), append(req.keys, key), append(req.costs, cost)
	if err := r.reserveAll(ctx, req); err != nil {
		return algorithms.Decision{}, 0, err
	}
	tag := 0.0
	if len(req.tags) > 0 {
		tag = req.tags[0]
	}
	return req.dec.Decision, tag, nil
}

func (r *RedisStore) reserveAll(ctx context.Context, req *multi) error {
	if r.available() {
		err := r.reserveRedis(ctx, req)
		if err == nil {
			return nil
		}
		if err := callerDone(ctx); err != nil { // the caller gave up or ran out of time: its error, unchanged
			return err
		}
		if !r.failed(err) {
			return &StoreError{Op: "reserve", Err: err}
		}
	} else if r.policy.kind == 0 {
		return &StoreError{Op: "reserve", Err: errors.New("redis failed less than half a second ago")}
	}
	r.degraded.Add(1)
	traceDegraded(ctx, "reserve")
	if r.policy.kind == 1 { // FailOpen
		req.dec = algorithms.AllDecision{Decision: algorithms.MakeDecision(true, 0, 0, 0)}
		req.tags = make([]float64, len(req.dims))
		return nil
	}
	local := *req
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
	req.dec, req.tags = local.dec, nil // a local slot cannot be cancelled on Redis
	return nil
}

func (r *RedisStore) reserveRedis(ctx context.Context, req *multi) error {
	if g, ok := req.algs[0].(*algorithms.GCRA); ok && len(req.dims) == 1 {
		return r.reserveGCRA(ctx, req, g)
	}
	ldims := make([]lua.Dim, len(req.dims))
	for i, a := range req.algs {
		kind, p := a.Params()
		ldims[i] = lua.Dim{Kind: kind, Params: p, Cost: req.costs[i]}
	}
	keys := redisKeys(req.dims, req.keys, req.keys[0])
	var v any
	err := r.call(ctx, func(ctx context.Context) error {
		var err error
		v, err = lua.Reserve.Run(ctx, r.client, keys, lua.ReserveArgs(r.now(req.now), ldims)...).Result()
		return err
	})
	if err != nil {
		return err
	}
	rep, err := lua.ParseReserve(v, len(req.dims))
	if err != nil {
		return err
	}
	req.dec = algorithms.AllDecision{Decision: algorithms.MakeDecision(rep.Allowed, rep.Wait, rep.Remaining, rep.Reset), Binding: rep.Binding}
	req.tags = rep.Tags
	return nil
}

// reserveGCRA is reserveRedis for most calls: one dimension of the GCRA
// family, through the script made for it (lua.ReserveGCRA), with its
// parameters formatted once, at bind. The script replies with the inputs of
// its transition; the figures are recomputed here with the same math.
func (r *RedisStore) reserveGCRA(ctx context.Context, req *multi, g *algorithms.GCRA) error {
	d := req.dims[0]
	params := &d.luaGCRA[0]
	if g != d.alg {
		params = &d.luaGCRA[1]
	}
	keys := redisKeys(req.dims, req.keys, req.keys[0])
	now := r.now(req.now)
	var v any
	err := r.call(ctx, func(ctx context.Context) error {
		var err error
		v, err = lua.ReserveGCRA.Run(ctx, r.client, keys, lua.ReserveGCRAArgs(now, params, req.costs[0])...).Result()
		return err
	})
	if err != nil {
		return err
	}
	rep, err := lua.ParseReserveGCRA(v, req.now)
	if err != nil {
		return err
	}
	var dec algorithms.Decision
	tag, err := rep.Decide(g, req.costs[0], &dec)
	if err != nil {
		return err
	}
	req.dec = algorithms.AllDecision{Decision: dec, Binding: rep.Binding}
	if dec.Allowed {
		req.tags = append(req.tags[:0], tag) // newMulti's array: no allocation
	}
	return nil
}

func (r *RedisStore) cancel(ctx context.Context, dims []*dim, keys []string, tags []float64, costs []int64) error {
	if tags == nil { // a slot granted by the local policy
		return nil
	}
	var rk []string
	var args []any
	all := redisKeys(dims, keys, keys[0])
	for i, d := range dims {
		if d.gcra == nil {
			continue
		}
		rk = append(rk, all[2*i])
		args = append(args, lua.Float(tags[i]), lua.Float(d.gcra.Interval()), strconv.FormatInt(costs[i], 10))
	}
	if len(rk) == 0 {
		return nil
	}
	return r.simple(ctx, "cancel", func(ctx context.Context) error {
		return lua.Cancel.Run(ctx, r.client, rk, args...).Err()
	})
}

func (r *RedisStore) pause(ctx context.Context, dims []*dim, keys []string, now, d float64) error {
	all := redisKeys(dims, keys, keys[0])
	pk := make([]string, len(dims))
	for i := range dims {
		pk[i] = all[2*i+1]
	}
	err := r.simple(ctx, "pause", func(ctx context.Context) error {
		return lua.Pause.Run(ctx, r.client, pk, r.now(now), lua.Float(d)).Err()
	})
	if r.local != nil { // the local fallback honours the pause too
		_ = r.local.pause(ctx, r.twins(dims), keys, now, d)
	}
	return err
}

func (r *RedisStore) reset(ctx context.Context, dims []*dim, keys []string) error {
	all := redisKeys(dims, keys, keys[0])
	return r.simple(ctx, "reset", func(ctx context.Context) error { return r.client.Del(ctx, all...).Err() })
}

// simple runs a write that has no local fallback: under FailOpen and
// FailLocal its failure is counted and ignored, under FailClosed returned.
func (r *RedisStore) simple(ctx context.Context, op string, f func(context.Context) error) error {
	err := r.call(ctx, f)
	switch {
	case err == nil:
		return nil
	case callerDone(ctx) != nil:
		return callerDone(ctx)
	case r.failed(err):
		r.degraded.Add(1)
		traceDegraded(ctx, op)
		return nil
	}
	return &StoreError{Op: op, Err: err}
}

// pauseLeft reads the pause keys' TTLs: a pause key lives exactly as long as
// its pause, on the server's clock, so no clock is compared. One round trip
// (PTTL for one key, a pipeline for several).
//
// While Redis is marked down (see failed), it is not asked: the FailLocal
// store answers for its mirrored pauses, the other policies report the
// outage, and Wait departs on its granted slot. Otherwise every request that
// slept would spend the store's timeout here during an outage.
func (r *RedisStore) pauseLeft(ctx context.Context, dims []*dim, keys []string, now float64) (float64, error) {
	if !r.available() {
		return r.localPauseLeft(ctx, dims, keys, now)
	}
	all := redisKeys(dims, keys, keys[0])
	left := time.Duration(0)
	err := r.call(ctx, func(ctx context.Context) error {
		cmds, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := range dims {
				p.PTTL(ctx, all[2*i+1])
			}
			return nil
		})
		if err != nil {
			return err
		}
		longest := time.Duration(0)
		for _, c := range cmds {
			longest = max(longest, c.(*redis.DurationCmd).Val())
		}
		left = longest
		return nil
	})
	if err != nil { // f may still run (see call): do not read left
		if callerDone(ctx) == nil {
			r.failed(err)
			return r.localPauseLeft(ctx, dims, keys, now)
		}
		return 0, err
	}
	return algorithms.DurationMillis(left), nil
}

// localPauseLeft answers pauseLeft while Redis is down.
func (r *RedisStore) localPauseLeft(ctx context.Context, dims []*dim, keys []string, now float64) (float64, error) {
	if r.local == nil {
		return 0, &StoreError{Op: "pause_left", Err: errors.New("redis is down")}
	}
	return r.local.pauseLeft(ctx, r.twins(dims), keys, now)
}

// twins returns the local store's twin of each dimension (see twin).
func (r *RedisStore) twins(dims []*dim) []*dim {
	out := make([]*dim, len(dims))
	for i, d := range dims {
		out[i] = r.twin(d)
	}
	return out
}
