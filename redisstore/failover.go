package redisstore

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/fair"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/trace"
	"github.com/throttlekit/throttlekit-go/memstore"
)

// failover is FailOpen and FailLocal: a decorator around the Redis
// backend that serves what Redis cannot (an outage: down or silent), and
// passes every other outcome through. FailLocal serves from a local twin
// of each dimension at the policy's share of its rate, kept level with
// Redis both ways (the handoff).
type failover struct {
	redis    *backend
	policy   FailurePolicy
	local    *memstore.Store // FailLocal
	twins    store.Backend   // FailLocal: local's backend
	handoff  handoff         // FailLocal: local slots Redis has not seen yet
	degraded atomic.Uint64

	lmu       sync.Mutex                               // listeners
	listeners map[string]map[*chan<- struct{}]struct{} // FailLocal: Freed's channels, by in-flight key
	// FailLocal: the keys' turns the twin decided last (turnSide), until
	// Redis decides them again.
	turnsLocal sync.Map
}

var _ store.Backend = (*failover)(nil)

// outage reports whether err is Redis down or silent, which the policy serves.
func outage(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.outage
}

// degrade counts an operation served by the policy.
func (f *failover) degrade(ctx context.Context, op string) {
	f.degraded.Add(1)
	if t := trace.From(ctx); t != nil && t.Degraded != nil {
		t.Degraded(ctx, op)
	}
}

// absorb is the outcome of a write the policy serves by doing nothing (the
// local twin, if any, has it already): an outage is counted and ignored.
func (f *failover) absorb(ctx context.Context, op string, err error) error {
	if outage(err) {
		f.degrade(ctx, op)
		return nil
	}
	return err
}

// Bind binds d on Redis and, under FailLocal, its twin on the local store.
func (f *failover) Bind(d *store.Dim) (any, error) {
	b, err := f.redis.Bind(d)
	if err != nil || f.local == nil {
		return b, err
	}
	twin := *d
	twin.Identity += " local"
	rd := b.(*redisDim)
	if rd.twin, err = f.atShare(d, twin, f.twins.Bind); err != nil {
		return nil, err
	}
	return rd, nil
}

// Rebind rebinds d, and its twin at the new rate.
func (f *failover) Rebind(d *store.Dim) (any, error) {
	old := redisOf(d)
	b, err := f.redis.Rebind(d)
	if err != nil || old.twin == nil {
		return b, err
	}
	rd := b.(*redisDim)
	if rd.twin, err = f.atShare(d, *old.twin, f.twins.Rebind); err != nil {
		return nil, err
	}
	return rd, nil
}

// atShare returns twin with d's algorithm at the policy's share of d's
// rate (a longer period), bound to the local store by bind.
func (f *failover) atShare(d *store.Dim, twin store.Dim, bind func(*store.Dim) (any, error)) (*store.Dim, error) {
	alg, allow, err := d.AtShare(f.policy.share)
	if err != nil {
		return nil, err
	}
	twin.Alg, twin.Allow = alg, allow
	twin.SetKernels()
	if twin.Bound, err = bind(&twin); err != nil {
		return nil, err
	}
	return &twin, nil
}

// twinsOf returns ks on the local twin of each dimension.
func twinsOf(ks store.KeySet) store.KeySet {
	out := make([]*store.Dim, len(ks.Dims))
	for i, d := range ks.Dims {
		out[i] = redisOf(d).twin
	}
	ks.Dims = out
	return ks
}

// Reserve reserves on Redis, handing the schedule over to and from the
// local twin under FailLocal: a key whose local slots Redis has not seen
// carries their end as the request's Floor, and every admission of the
// GCRA family seeds the twin with Redis's TAT, so that whichever serves
// next continues the schedule instead of starting one beside it.
func (f *failover) Reserve(ctx context.Context, req *store.Request) error {
	d := req.Dims[0]
	handsOver := f.local != nil && len(req.Dims) == 1 && d.Kern != nil
	if handsOver && f.handoff.pending() {
		req.Floor = f.handoff.floor(d, req.Keys[0], algorithms.Millis(d.Clock.Now()))
	}
	err := f.redis.Reserve(ctx, req)
	switch {
	case err == nil:
		if handsOver && req.Dec.Allowed {
			// Redis's TAT on this process's clock, read after the reply:
			// later than on the server's, so the local schedule never starts early.
			local := algorithms.Millis(d.Clock.Now())
			f.twins.(store.Seeder).Seed(redisOf(d).twin, req.Keys[0], local+(req.Tags[0]-req.Decided), local)
			if req.Floor > 0 {
				f.handoff.done(d, req.Keys[0])
			}
		}
		return nil
	case !outage(err):
		return err
	}
	f.degrade(ctx, "reserve")
	req.Local = true
	if f.local == nil { // FailOpen: admitted at once, nothing to give back
		req.Dec = algorithms.AllDecision{Decision: decisionOf(true, 0), Took: 1<<len(req.Dims) - 1}
		req.Tags = nil
		return nil
	}
	local := *req
	local.Now = algorithms.Millis(d.Clock.Now()) // the call may have taken the whole timeout
	local.KeySet = twinsOf(req.KeySet)
	local.Algs = make([]algorithms.Algorithm, len(req.Dims))
	for i, dm := range req.Dims {
		local.Algs[i] = local.Dims[i].Alg
		if req.Algs[i] == dm.Allow {
			local.Algs[i] = local.Dims[i].Allow
		}
	}
	if err := f.twins.Reserve(ctx, &local); err != nil {
		return err
	}
	req.Dec, req.Tags, req.Gens, req.Seqs, req.At, req.Decided = local.Dec, local.Tags, local.Gens, local.Seqs, local.At, local.Decided
	if handsOver && req.Dec.Allowed && len(req.Tags) == 1 {
		f.handoff.granted(d, req.Keys[0], req.Tags[0])
	}
	return nil
}

// Settle gives a slot back where it was granted: a local one to the twin
// (FailOpen granted nothing), the others to Redis.
func (f *failover) Settle(ctx context.Context, st *store.Settlement) error {
	if !st.Local {
		return f.absorb(ctx, "settle", f.redis.Settle(ctx, st))
	}
	if f.local == nil || st.Tags == nil || len(st.Gens) != len(st.Tags) {
		return nil
	}
	local := *st
	local.KeySet = twinsOf(st.KeySet)
	return f.twins.Settle(ctx, &local)
}

// Pause pauses the keys on Redis and, under FailLocal, on the twins.
func (f *failover) Pause(ctx context.Context, ks store.KeySet, now, d float64) error {
	err := f.redis.Pause(ctx, ks, now, d)
	if f.local != nil && !errors.Is(err, store.ErrInvalidState) { // the local fallback honours the pause too
		_ = f.twins.Pause(ctx, twinsOf(ks), now, d)
	}
	return f.absorb(ctx, "pause", err)
}

// Clamp clamps the keys on Redis and, under FailLocal, on the twins.
func (f *failover) Clamp(ctx context.Context, ks store.KeySet, now, interval, span float64, keepTighter bool) error {
	err := f.redis.Clamp(ctx, ks, now, interval, span, keepTighter)
	if f.local != nil && !errors.Is(err, store.ErrInvalidState) { // the local fallback honours the clamp too
		_ = f.twins.Clamp(ctx, twinsOf(ks), now, interval, span, keepTighter)
	}
	return f.absorb(ctx, "clamp", err)
}

// Reset forgets the keys on Redis.
func (f *failover) Reset(ctx context.Context, ks store.KeySet, now float64) error {
	return f.absorb(ctx, "reset", f.redis.Reset(ctx, ks, now))
}

// Status reads Redis; during an outage FailLocal answers from its twins
// (what it would grant), FailOpen reports the outage: there is no shared
// figure to give.
func (f *failover) Status(ctx context.Context, q *store.Query) error {
	err := f.redis.Status(ctx, q)
	if !outage(err) || f.local == nil {
		return err
	}
	local := *q
	local.KeySet = twinsOf(q.KeySet)
	local.Algs = make([]algorithms.Algorithm, len(q.Dims))
	for i, d := range local.Dims {
		local.Algs[i] = d.Alg
	}
	local.Now = algorithms.Millis(q.Dims[0].Clock.Now())
	if err := f.twins.Status(ctx, &local); err != nil {
		return err
	}
	q.At, q.Until, q.Binding, q.Figures = local.At, local.Until, local.Binding, local.Figures
	return nil
}

// PauseLeft reads Redis; during an outage FailLocal answers for the pauses
// it mirrored.
func (f *failover) PauseLeft(ctx context.Context, ks store.KeySet, now float64) (float64, error) {
	left, err := f.redis.PauseLeft(ctx, ks, now)
	if !outage(err) || f.local == nil {
		return left, err
	}
	return f.twins.PauseLeft(ctx, twinsOf(ks), now)
}

// ReadContract reads Redis: a live contract has no local form.
func (f *failover) ReadContract(ctx context.Context, prefix string) (store.Record, error) {
	return f.redis.ReadContract(ctx, prefix)
}

// WriteContract writes Redis: a live change is refused during an outage.
func (f *failover) WriteContract(ctx context.Context, prefix, identity, field, value string) (store.Record, error) {
	return f.redis.WriteContract(ctx, prefix, identity, field, value)
}

// Remote is the Redis backend's.
func (f *failover) Remote() bool { return f.redis.Remote() }

// Watch is nil, as the Redis backend's.
func (f *failover) Watch(string) *atomic.Uint64 { return nil }

// TakePermit takes a lease on Redis. During an outage FailOpen grants an
// Open lease, counting nothing, and FailLocal takes one of the twin's, at
// the policy's share of the limit (at least 1), counting the leases this
// process holds in Redis as held: a process never holds more than its share
// on both sides together, unless it held more in Redis when Redis went down
// (then it takes none locally until it holds less). Each grant of the policy
// is registered in Redis, whatever the key holds, as soon as Redis answers
// again (leases.hold with adopt), and on this key before Redis grants this
// process anything more (the handoff back): a permit granted while Redis
// was down and still in use counts in Redis until it is released. A take of
// this process on its way to Redis counts as held for the policy's share
// (leases.begin, leases.share): Redis may grant it whatever the outage.
func (f *failover) TakePermit(ctx context.Context, p *store.Permit, id string, now float64) (store.Taken, error) {
	l := &f.redis.permits.leases
	for adopted := false; l.begin(p, true); adopted = true {
		if adopted || !f.redis.health.IsUp() { // still not registered (closed, or a call that failed alone), or Redis judged down: do not grant past them
			return f.serve(ctx, p, id, now)
		}
		if err := l.adoptNow(f.redis, p); err != nil {
			return f.serve(ctx, p, id, now)
		}
	}
	t, err := f.redis.take(ctx, p, id, now)
	if !outage(err) {
		if err != nil && f.local != nil && !f.redis.health.IsUp() {
			f.notify(p) // a share refused while this take was on its way may be free now
		}
		return t, err
	}
	return f.serve(ctx, p, id, now)
}

// serve is TakePermit by the policy. Its grant has an id of its own (id
// followed by "/p"): the Redis take of id may have run, and its clean-up
// (a tombstone for id) must not keep the grant from being registered.
func (f *failover) serve(ctx context.Context, p *store.Permit, id string, now float64) (store.Taken, error) {
	f.degrade(ctx, "take_permit")
	id += "/p"
	l := &f.redis.permits.leases
	if f.local == nil {
		l.hold(f.redis, p, id, true, nil)
		return store.Taken{OK: true, Lease: store.Lease{ID: id, Open: true}, Expiry: math.Inf(1)}, nil
	}
	share := max(1, int64(math.Floor(float64(p.Limit)*f.policy.share)))
	twin := *p
	t, err := l.share(f.redis, p, id, func() { // registered in Redis: it counts there, and among this process's Redis leases
		_ = f.twins.ReleasePermit(context.Background(), &twin, store.Lease{ID: id})
	}, func(own int64) (store.Taken, error) {
		local := *p
		local.Limit = share - own
		var t store.Taken
		if local.Limit > 0 {
			var err error
			if t, err = f.twins.TakePermit(ctx, &local, id, now); err != nil {
				return t, err
			}
		} else {
			n, err := f.twins.PermitsInUse(ctx, &local, now)
			if err != nil {
				return store.Taken{}, err
			}
			t = store.Taken{InUse: n}
		}
		t.InUse += own
		return t, nil
	})
	if err != nil {
		return t, err
	}
	if !t.OK {
		// A permit this process holds in Redis may be released during
		// the outage (a notice, f.listeners), or Redis may come back.
		t.Expiry = min(t.Expiry, algorithms.DurationMillis(time.Second))
		return t, nil
	}
	t.Lease.Local = true
	return t, nil
}

// ReleasePermit gives a lease back where it is held: a Local one to the
// twin, and every one to Redis if it is there (a policy's grant once
// registered; Open and Local leases never registered are nothing to Redis).
// During an outage a release Redis did not hear is counted and left to the
// Redis backend's clean-up (retried until Redis answers), and this
// process's waiters are told: a permit its twin counted is free.
func (f *failover) ReleasePermit(ctx context.Context, p *store.Permit, l store.Lease) error {
	if l.Local && f.local != nil {
		if err := f.twins.ReleasePermit(ctx, p, l); err != nil {
			return err
		}
	}
	err := f.redis.ReleasePermit(ctx, p, l)
	if outage(err) {
		f.notify(p)
	}
	return f.absorb(ctx, "release_permit", err)
}

// PermitsInUse reads Redis; during an outage FailLocal answers with what it
// counts (the twin's and this process's Redis leases), FailOpen reports the
// outage: there is no shared figure.
func (f *failover) PermitsInUse(ctx context.Context, p *store.Permit, now float64) (int64, error) {
	n, err := f.redis.PermitsInUse(ctx, p, now)
	if !outage(err) || f.local == nil {
		return n, err
	}
	if n, err = f.twins.PermitsInUse(ctx, p, now); err != nil {
		return n, err
	}
	own, _ := f.redis.permits.leases.count(p)
	return n + own, nil
}

// Turn asks Redis; during an outage FailLocal's twin takes the turns of
// this process's flows, and under the other policies the outage is
// reported (the shaper then serves its flows in its own order, and each
// reservation meets the policy).
//
// The shaper tells a store only what changed since its last call, so when
// the turns move from Redis to the twin or back, the store deciding forgets
// what it held of the caller (Fresh: it may be stale) and the reply says
// Renewed, so that the shaper registers its flows there anew.
func (f *failover) Turn(ctx context.Context, t *store.Turns, p fair.Params, ups []fair.Update) (fair.Reply, error) {
	side := turnSide{t.Base, t.Key, t.Owner}
	_, local := f.turnsLocal.Load(side)
	q := p
	q.Fresh = p.Fresh || local
	reply, err := f.redis.Turn(ctx, t, q, ups)
	if !outage(err) || f.local == nil {
		if err == nil && local {
			f.turnsLocal.Delete(side)
			reply.Renewed = true
		}
		return reply, err
	}
	f.degrade(ctx, "fair_turn")
	q.Fresh = p.Fresh || !local
	f.turnsLocal.Store(side, struct{}{})
	reply, err = f.twins.Turn(ctx, t, q, ups)
	if err == nil && !local {
		reply.Renewed = true
	}
	return reply, err
}

// turnSide names an owner's turns on a key: turnsLocal holds those the
// twin decided last.
type turnSide struct{ base, key, owner string }

// Freed registers ch with Redis and, under FailLocal, with the twin and
// with this failover (a Redis lease released during an outage), so that the
// releases of either reach it; stop unregisters all.
func (f *failover) Freed(p *store.Permit, ch chan<- struct{}) (stop func()) {
	stopRedis := f.redis.Freed(p, ch)
	if f.local == nil {
		return stopRedis
	}
	stopLocal := f.twins.Freed(p, ch)
	k, ref := permitKey(p), &ch
	f.lmu.Lock()
	if f.listeners == nil {
		f.listeners = map[string]map[*chan<- struct{}]struct{}{}
	}
	if f.listeners[k] == nil {
		f.listeners[k] = map[*chan<- struct{}]struct{}{}
	}
	f.listeners[k][ref] = struct{}{}
	f.lmu.Unlock()
	return func() {
		stopRedis()
		stopLocal()
		f.lmu.Lock()
		delete(f.listeners[k], ref)
		if len(f.listeners[k]) == 0 {
			delete(f.listeners, k)
		}
		f.lmu.Unlock()
	}
}

// notify tells the waiters of p's key in this process that a permit may
// have freed.
func (f *failover) notify(p *store.Permit) {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	for ch := range f.listeners[permitKey(p)] {
		select {
		case *ch <- struct{}{}:
		default:
		}
	}
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
	d   *store.Dim
	key string
}

// granted records a local slot whose reservation stored tat.
func (h *handoff) granted(d *store.Dim, key string, tat float64) {
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
func (h *handoff) floor(d *store.Dim, key string, now float64) float64 {
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
func (h *handoff) done(d *store.Dim, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.m[handoffKey{d, key}]; ok {
		delete(h.m, handoffKey{d, key})
		h.n.Add(-1)
	}
}

// Learn keeps the learned record on Redis; during an outage FailLocal's
// twin keeps this process's (its clamp holds the twin's keys), the others
// report the outage (the shaper then keeps the rate it holds).
func (f *failover) Learn(ctx context.Context, l *store.Learned, op *store.LearnOp) (string, []store.Tally, error) {
	v, t, err := f.redis.Learn(ctx, l, op)
	if !outage(err) || f.local == nil {
		return v, t, err
	}
	twin := *l
	twin.KeySet = twinsOf(l.KeySet)
	return f.twins.Learn(ctx, &twin, op)
}
