package shaper

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/trace"
)

// DefaultLease is how long an in-flight permit outlives a process that died
// holding it, on a shared store, unless Dimension.Lease says otherwise.
const DefaultLease = 10 * time.Second

// MinLease is the shortest Dimension.Lease accepted: a Redis store renews
// the leases its process holds every fifth of a lease.
const MinLease = 100 * time.Millisecond

// DefaultMaxWaiting is how many requests may wait for a permit of one key
// in one process, unless Dimension.MaxWaiting says otherwise.
const DefaultMaxWaiting = 1024

// recheck is the longest a waiter for a permit on a shared store waits for
// a release notice before it asks again: a notice lost while the store's
// subscription reconnected costs at most this much.
const recheck = time.Second

// flight is a shaper's in-flight dimension: its permits, and per key the
// requests of this process waiting for one, in arrival order (by flow
// turns for requests that carry flows).
type flight struct {
	dim        store.Dim // what the store reads: Name, Base, Prefix
	key        func(string) string
	limit      int64
	lease      time.Duration
	maxWaiting int

	mu    sync.Mutex
	rooms map[string]*room
}

// room is the waiting room of one key: waiters[0] is the head, the one
// waiter that asks the store; the others wait for their turn, so a release
// wakes one request of the process, not all of them, and they are served
// in order (no barging: a request that finds a room waits in it).
type room struct {
	waiters []*waiter
	notify  chan struct{} // a permit of the key may have freed (store.Permits.Freed)
	stop    func()
	// The waiters are in the order of their flows' turns (a request with
	// no Flow is in the flow ""): start-time fair queuing in this process,
	// a permit for a turn of cost 1. Requests of one flow keep their
	// arrival order, so with one flow the room is first come, first served.
	v      float64            // the tag of the last waiter that became the head
	finish map[string]float64 // per flow, the finish tag of its last waiter
}

type waiter struct {
	turn chan struct{} // closed when it becomes the head
	tag  float64       // its flow's start tag (see room)
	flow string
}

// newFlight checks spec, an in-flight dimension, and returns it.
func newFlight(cfg *config, spec Dimension) (*flight, error) {
	bad := func(field string, v any, why string) error {
		return &ConfigError{Algorithm: "in-flight", Field: "Dimension." + field, Value: v, Reason: why}
	}
	switch {
	case spec.InFlight < 1 || spec.InFlight > MaxInFlight:
		return nil, bad("InFlight", spec.InFlight, fmt.Sprintf("must be in [1, %d]", MaxInFlight))
	case spec.Lease != 0 && (spec.Lease < MinLease || spec.Lease > MaxPause):
		return nil, bad("Lease", spec.Lease, fmt.Sprintf("must be 0 (DefaultLease) or in [%v, %v]", MinLease, MaxPause))
	case spec.MaxWaiting < 0:
		return nil, bad("MaxWaiting", spec.MaxWaiting, "must be >= 0 (0: DefaultMaxWaiting)")
	case spec.Rate != Rate{}:
		return nil, bad("Rate", spec.Rate, "an in-flight dimension has no rate: give the rate its own dimension")
	case spec.Cost != nil:
		return nil, bad("Cost", "func", "every request holds one permit: an in-flight dimension has no Cost")
	}
	f := &flight{key: spec.Key, limit: spec.InFlight, lease: cmp.Or(spec.Lease, DefaultLease), maxWaiting: cmp.Or(spec.MaxWaiting, DefaultMaxWaiting), rooms: map[string]*room{}}
	f.dim = store.Dim{Name: spec.Name, Base: cfg.prefix, Prefix: cfg.prefix, Identity: fmt.Sprintf("in-flight %d", spec.InFlight), Clock: cfg.clock}
	if spec.Name != "" {
		f.dim.Prefix += spec.Name + ":"
	}
	return f, nil
}

// MaxInFlight is the largest Dimension.InFlight accepted.
const MaxInFlight = 1 << 20

// permit returns the store's name of key's permits.
func (f *flight) permit(key string) (store.Permit, error) {
	k := key
	if f.key != nil {
		k = f.key(key)
		if err := checkKey(k); err != nil {
			return store.Permit{}, err
		}
	}
	return store.Permit{Dim: &f.dim, Key: k, Slot: k, Limit: f.limit, Lease: algorithms.DurationMillis(f.lease)}, nil
}

// hold is a permit held by a reservation and all its copies: released
// once, by whichever copy releases first.
type hold struct {
	s        *Shaper
	p        store.Permit
	lease    store.Lease
	released atomic.Bool
	ctx      context.Context // the acquiring call's, for its trace hooks
}

// newLeaseID returns an id no other grant uses: 128 random bits.
func newLeaseID() string {
	return strconv.FormatUint(rand.Uint64(), 36) + "." + strconv.FormatUint(rand.Uint64(), 36)
}

// full is the refusal of a request that found no permit and would not, or
// could not, wait for one.
func (s *Shaper) full(key string) error {
	return &QueueFullError{Key: key, Dimension: s.flight.dim.Name, InFlight: true, MaxQueue: s.MaxQueue()}
}

// take takes a permit of key; with wait it waits for one in the key's room
// (bounded by MaxWaiting and ctx), else it takes one only if one is free
// and nobody of this process waits.
func (s *Shaper) take(ctx context.Context, key string, wait bool) (*hold, error) {
	p, err := s.flight.permit(key)
	if err != nil {
		return nil, err
	}
	start, id := s.cfg.clock.Now(), newLeaseID()
	if s.flight.waiting(p.Key) == 0 { // nobody of this process waits: try at once
		t, err := s.takeOnce(ctx, &p, id)
		if err != nil {
			return nil, err
		}
		if t.OK {
			return s.held(ctx, p, t.Lease, start), nil
		}
	}
	if !wait {
		return nil, s.full(key)
	}
	f, _ := FlowOf(ctx)
	if err := f.check(); err != nil {
		return nil, err
	}
	rm, w := s.flight.join(s, &p, f)
	if w == nil {
		return nil, s.full(key)
	}
	defer s.flight.leave(p.Key, rm, w)
	select {
	case <-w.turn:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for { // the head: ask, then wait for a release notice
		t, err := s.takeOnce(ctx, &p, id)
		if err != nil {
			return nil, err
		}
		if t.OK {
			return s.held(ctx, p, t.Lease, start), nil
		}
		if err := s.awaitRelease(ctx, rm, t.Expiry); err != nil {
			return nil, err
		}
	}
}

// held returns the hold of lease l on p, taken for a call that asked at
// start, and tells ctx's trace how long it waited.
func (s *Shaper) held(ctx context.Context, p store.Permit, l store.Lease, start time.Time) *hold {
	if t := trace.From(ctx); t != nil && t.PermitTaken != nil {
		t.PermitTaken(ctx, s.cfg.clock.Now().Sub(start))
	}
	return &hold{s: s, p: p, lease: l, ctx: context.WithoutCancel(ctx)}
}

// join puts a waiter at the end of p's room, opening the room (registered
// for the store's release notices) if there is none; the first waiter is
// the head at once. It returns no waiter when MaxWaiting already wait.
func (f *flight) join(s *Shaper, p *store.Permit, fl Flow) (*room, *waiter) {
	f.mu.Lock()
	rm := f.rooms[p.Key]
	var unused func() // a registration another request's room made needless
	if rm == nil {
		// Registered outside f.mu: a shared store may wait for its
		// subscription to be confirmed.
		f.mu.Unlock()
		notify := make(chan struct{}, 1)
		stop := s.store.Freed(p, notify)
		f.mu.Lock()
		if rm = f.rooms[p.Key]; rm == nil {
			rm = &room{notify: notify, stop: stop, finish: map[string]float64{}}
			f.rooms[p.Key] = rm
		} else {
			unused = stop
		}
	}
	var w *waiter
	if len(rm.waiters) < f.maxWaiting {
		tag := max(rm.v, rm.finish[fl.Name])
		rm.finish[fl.Name] = tag + 1/fl.Weight
		if len(rm.finish) > 2*len(rm.waiters)+16 { // forget the flows V has passed: they start at V
			for name, f := range rm.finish {
				if f <= rm.v {
					delete(rm.finish, name)
				}
			}
		}
		w = &waiter{turn: make(chan struct{}), tag: tag, flow: fl.Name}
		// After the head, and after every waiter whose tag is not above
		// its own: a flow's requests keep their order.
		at := len(rm.waiters)
		for at > 1 && rm.waiters[at-1].tag > tag {
			at--
		}
		if rm.waiters = slices.Insert(rm.waiters, at, w); len(rm.waiters) == 1 {
			rm.v = tag
			close(w.turn)
		}
	} else {
		f.leaveLocked(p.Key, rm, nil) // closes a room just opened
	}
	f.mu.Unlock()
	if unused != nil {
		unused()
	}
	return rm, w
}

// awaitRelease waits for a notice that a permit of rm's key freed, or,
// on a shared store, for the earliest lease to expire (its holder may have
// died) or recheck to pass (a notice may have been lost).
func (s *Shaper) awaitRelease(ctx context.Context, rm *room, expiry float64) error {
	var expired <-chan time.Time
	if !math.IsInf(expiry, 1) {
		tm := s.cfg.clock.NewTimer(min(algorithms.Duration(max(expiry, 0))+time.Millisecond, recheck))
		defer tm.Stop()
		expired = tm.C()
	}
	select {
	case <-rm.notify:
	case <-expired:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// takeOnce asks the store for a permit once. A take that fails holds
// nothing: a store whose call may have taken the lease before it failed (a
// deadline, a timeout, an outage) gives it back itself, in order after the
// take (store.Permits).
func (s *Shaper) takeOnce(ctx context.Context, p *store.Permit, id string) (store.Taken, error) {
	st := startStore(ctx)
	t, err := s.store.TakePermit(ctx, p, id, algorithms.Millis(s.cfg.clock.Now()))
	st.done("take_permit", err)
	return t, err
}

// leave takes w out of the room: the next waiter becomes the head and asks
// at once (a release may have freed several permits, or w left without
// one); an empty room is closed.
func (f *flight) leave(key string, rm *room, w *waiter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leaveLocked(key, rm, w)
}

func (f *flight) leaveLocked(key string, rm *room, w *waiter) {
	for i, x := range rm.waiters {
		if x == w {
			rm.waiters = append(rm.waiters[:i], rm.waiters[i+1:]...)
			if i == 0 && len(rm.waiters) > 0 {
				rm.v = rm.waiters[0].tag
				close(rm.waiters[0].turn)
			}
			break
		}
	}
	if len(rm.waiters) == 0 && f.rooms[key] == rm {
		delete(f.rooms, key)
		rm.stop()
	}
}

// waiting returns how many requests of this process wait for a permit of key.
func (f *flight) waiting(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rm := f.rooms[key]; rm != nil {
		return len(rm.waiters)
	}
	return 0
}

// release gives h's permit back, once.
func (h *hold) release(ctx context.Context) error {
	if h == nil || !h.released.CompareAndSwap(false, true) {
		return nil
	}
	s := h.s
	if t := trace.From(h.ctx); t != nil && t.PermitReleased != nil {
		t.PermitReleased(h.ctx)
	}
	ctx = context.WithoutCancel(ctx) // a done ctx must not keep a permit held
	st := startStore(ctx)
	err := s.store.ReleasePermit(ctx, &h.p, h.lease)
	st.done("release_permit", err)
	return err
}

// Release gives back the in-flight permit r holds (see Dimension.InFlight),
// once the call it paced has ended: transport.New's Transport releases
// when the response body is closed or read to its end, or the round trip
// fails; a queue.Queue when the job returns; code calling Reserve or
// Acquire itself releases with this, in a defer. Releasing is idempotent,
// and releases only r's own permit: a copy of r released before, or after,
// does nothing, and a permit whose lease expired and was granted to
// another request is not taken from it. A done ctx still releases. An
// error says the store could not be told; on Redis the permit then comes
// back when its lease expires (Dimension.Lease). r holds no permit when
// its shaper has no in-flight dimension: Release does nothing then.
func (r *Reservation) Release(ctx context.Context) error { return r.permit.release(ctx) }

// HoldsPermits reports whether reservations of key hold an in-flight
// permit to release (Reservation.Release): the shaper has an in-flight
// dimension. Such a shaper's Wait and Allow fail, since their caller
// could not release: use Acquire, or Reserve.
func (s *Shaper) HoldsPermits(key string) bool { return s != nil && s.flight != nil }

// errHoldsPermits is Wait's and Allow's answer on a shaper with an
// in-flight dimension.
func (s *Shaper) errHoldsPermits() error {
	return &ConfigError{Algorithm: "in-flight", Field: "Dimension.InFlight", Value: s.flight.limit,
		Reason: "a shaper with an in-flight dimension grants permits that must be released: use Acquire or Reserve, and Reservation.Release (Wait and Allow could not release)"}
}

// holding is Reserve (wait false) and Acquire (wait true) on a shaper with
// an in-flight dimension: bad input is refused before anything is taken;
// then a permit, then the slot in the dimensions of rate. The permit is
// given back when no slot is granted.
func (s *Shaper) holding(ctx context.Context, key string, cost int64, mode int) (Reservation, error) {
	c := s.live()
	if err := s.validate(ctx, c, key, cost); err != nil {
		return Reservation{}, err
	}
	if f, ok := FlowOf(ctx); ok && mode != holdReserve { // a bad flow takes no permit
		if err := f.check(); err != nil {
			return Reservation{}, err
		}
	}
	h, err := s.take(ctx, key, mode != holdReserve)
	if err != nil {
		return Reservation{}, err
	}
	var r Reservation
	switch {
	case s.rateless:
		r = Reservation{s: s, c: c, now: s.cfg.clock.Now(), key: key, cost: cost, m: nothingToLimit, done: true}
	case mode == holdAcquire:
		r, err = s.acquire(ctx, key, cost, taken)
	case mode == holdTurn:
		f, _ := FlowOf(ctx)
		_ = f.check() // AwaitTurn refused it if bad: this sets the default weight
		r, err = s.awaitTurn(ctx, key, cost, f)
	default:
		r, err = s.reserve(ctx, key, cost, noLimit, false)
	}
	if err != nil {
		_ = h.release(ctx)
		return Reservation{}, err
	}
	r.permit = h
	return r, nil
}

// How holding takes the slot once it holds the permit.
const (
	holdReserve = iota // Reserve: at once, never waiting for a permit
	holdAcquire        // Acquire: waits for the slot
	holdTurn           // AwaitTurn: waits for the turn, not the slot
)

// validate refuses what the dimensions of rate would refuse of key and
// cost whatever their state: a bad key, a cost never admissible.
func (s *Shaper) validate(ctx context.Context, c *contract, key string, cost int64) error {
	if _, err := s.check(ctx, c, key, cost); err != nil {
		return err
	}
	cs, err := s.costsOf(ctx, c, key)
	if err != nil {
		return err
	}
	for _, d := range c.dims {
		n, err := mapCost(cs, d, key, cost)
		if err != nil || n == 0 {
			if err != nil {
				return err
			}
			continue
		}
		k := key
		if d.key != nil {
			if k = d.key(key); checkKey(k) != nil {
				return checkKey(k)
			}
		}
		if err := validCost(d, d.Alg, k, n); err != nil { // All alone holds permits: any cost refused is an error
			return err
		}
	}
	return nil
}
