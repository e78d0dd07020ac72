package shaper

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/trace"
)

// Dimension is one contract of a multi-dimension shaper (see All).
type Dimension struct {
	Name string // unique within a shaper; names the dimension in keys, errors and metrics
	Rate Rate
	// Key maps the caller's key to this dimension's (nil: the same key); keys
	// mapping to one dimension key share its budget (an account over users).
	Key func(key string) string
	// Cost maps the caller's cost to this dimension's units (nil: the same);
	// a mapped cost of 0 leaves the dimension out of that request.
	Cost func(cost int64) int64
	// Slot marks the broadest dimension, whose key every other dimension's
	// key determines: on Redis every key of a reservation lives in its key's
	// cluster slot. Unmarked, it is the one dimension with a Key mapping (or
	// the caller's key when none maps); All refuses two mappings unmarked.
	Slot bool
	// Algorithm is this dimension's algorithm (zero: the shaper's,
	// WithAlgorithm's). Dimensions that queue (LeakyBucket, TrailingWindow)
	// and dimensions that do not cannot be mixed in one shaper.
	Algorithm Algorithm

	// InFlight, when > 0, makes this an in-flight dimension instead of a
	// rate (Rate and Cost unset): at most InFlight requests hold a permit
	// of its key at once, fleet-wide on a Redis store. A request takes a
	// permit when it is granted (waiting for one in Acquire, never in
	// Reserve), then its slot in the other dimensions, and holds the
	// permit until it is released (Reservation.Release). A shaper has at
	// most one in-flight dimension, alone or beside rates (All, not Any);
	// it is never the Slot dimension. docs/INFLIGHT.md says more.
	InFlight int64
	// Lease is how long a permit outlives a process that died holding it,
	// on a Redis store, which renews the leases of a live process every
	// third of it (0: DefaultLease; at least MinLease). A memory store's
	// permits die with their process.
	Lease time.Duration
	// MaxWaiting caps the requests of one process waiting for a permit of
	// one key, in arrival order (0: DefaultMaxWaiting); past it Acquire is
	// refused at once with a *QueueFullError naming the dimension.
	MaxWaiting int
}

// Shaper paces requests per key against a contract: every request reserves a
// departure slot. Its state lives in its Store, so shapers in many processes
// sharing a Redis store share one budget per key. It is safe for concurrent
// use.
type Shaper struct {
	cfg    config
	store  store.Backend
	one    store.OneKey             // the store's in-process single-key branch (nil: none; see reserveOne)
	cur    atomic.Pointer[contract] // the dimensions and MaxQueue in force (see live.go)
	lates  atomic.Int64             // slots retaken by callers that woke too late (WithLateness)
	ahead  *horizon                 // WithHorizon's gate (nil: none)
	queues bool                     // the leaky bucket: Reserve grants delays

	// remote: the store decides on another clock (Redis TIME) and answers
	// after a round trip, so a reservation's delay counts from a clock
	// reading taken after the reply: a departure is then never earlier
	// than its slot on the store's timeline, however long the call took. A
	// store on the shaper's own clock (memory, WithClientClock) decides at
	// the now it is given, and the delay counts from that now.
	remote bool
	single bool // one dimension, no Key or Cost mapping
	any    bool // Any: a dimension admitting is enough (algorithms.AnyWithin)
	slot   *dim // the dimension whose key is the hash slot (nil: the caller's key); see Dimension.Slot

	flight    *flight   // the in-flight dimension (nil: none); see inflight.go
	fairRooms fairRooms // the requests waiting for their flow's turn, per key (fair.go)
	rateless  bool      // no dimension but the in-flight one

	learner *learner // WithLearning: each key's learned rate (learn.go); nil: none

	liveState // changing the contract while it runs (live.go)
}

// dim is one resolved dimension: what its store reads (store.Dim, first,
// so that the hot path's fields share a cache line), and the shaper's own.
type dim struct {
	store.Dim
	key      func(string) string // Dimension.Key
	cost     func(int64) int64   // Dimension.Cost
	spec     Algorithm           // how Alg was built
	rate     Rate
	maxQueue time.Duration
}

// newDim returns spec's dimension under cfg at rate and maxQueue, unbound.
func newDim(cfg *config, spec Dimension, rate Rate, maxQueue time.Duration) (*dim, error) {
	a := spec.Algorithm
	if a.kind == 0 {
		a = cfg.alg
	}
	alg, allow, err := a.build(rate, maxQueue)
	if err != nil {
		return nil, err
	}
	d := &dim{key: spec.Key, cost: spec.Cost, spec: a, rate: rate, maxQueue: maxQueue}
	d.Dim = store.Dim{
		Name:     spec.Name,
		Base:     cfg.prefix,
		Prefix:   cfg.prefix,
		Identity: fmt.Sprintf("%v %v maxqueue=%v", a, rate, maxQueue),
		Alg:      alg,
		Allow:    allow,
		Clock:    cfg.clock,
		AtShare: func(share float64) (algorithms.Algorithm, algorithms.Algorithm, error) {
			scaled := rate
			scaled.Period = time.Duration(float64(rate.Period) / share)
			return a.build(scaled, maxQueue)
		},
	}
	if spec.Name != "" {
		d.Prefix += spec.Name + ":"
	}
	d.SetKernels()
	return d, nil
}

// New returns a shaper of one contract over store: by default the leaky
// bucket, with MaxQueue DefaultMaxQueue.
func New(store Store, rate Rate, opts ...Option) (*Shaper, error) {
	return newShaper(store, []Dimension{{Rate: rate}}, opts)
}

// All returns a shaper of several contracts at once: a request departs at the
// earliest instant every dimension allows, and consumes in all or in none;
// the order of dims never matters; at most MaxDimensions. An LLM API's 3,500 requests and 90,000
// tokens per minute, reserving each call's tokens as its cost (package
// partner builds such dimensions from a partner's stated limits, allowing
// for the lateness of departures: use it for a partner's limits):
//
//	shaper.All(store, []shaper.Dimension{
//		{Name: "requests", Rate: shaper.PerMinute(3500), Cost: func(int64) int64 { return 1 }},
//		{Name: "tokens", Rate: shaper.PerMinute(90000), Algorithm: shaper.TrailingWindow},
//	})
func All(store Store, dims []Dimension, opts ...Option) (*Shaper, error) {
	return combine(store, dims, opts, false)
}

// Any returns a shaper of several contracts of which any one may admit a
// request: it departs at the earliest instant some dimension allows, and
// only the dimensions that admit it then consume (a refusal consumes
// nothing). A partner that grants each account its own 10/s and lets every
// account draw on a shared pool of 100/s besides:
//
//	shaper.Any(store, []shaper.Dimension{
//		{Name: "own", Rate: shaper.PerSecond(10)},
//		{Name: "pool", Rate: shaper.PerSecond(100), Key: func(string) string { return "pool" }},
//	})
//
// The binding dimension (Status, QueueFullError) is the admitting one with
// the most requests of the cost left, or, when none admits, the one that
// admits soonest. A cost that one dimension could never admit leaves that
// dimension out; at most MaxDimensions dimensions.
func Any(store Store, dims []Dimension, opts ...Option) (*Shaper, error) {
	return combine(store, dims, opts, true)
}

// MaxDimensions is the most dimensions All and Any combine: a decision
// records which dimensions committed in one 64-bit mask.
const MaxDimensions = algorithms.MaxAnyDims

// combine is All (any false) and Any.
func combine(store Store, dims []Dimension, opts []Option, any bool) (*Shaper, error) {
	if len(dims) == 0 {
		return nil, &ConfigError{Algorithm: "shaper", Field: "Dimensions", Value: 0, Reason: "need at least one"}
	}
	if len(dims) > MaxDimensions {
		return nil, &ConfigError{Algorithm: "shaper", Field: "Dimensions", Value: len(dims), Reason: fmt.Sprintf("a shaper combines at most %d (MaxDimensions)", MaxDimensions)}
	}
	rates := 0 // the rate dimensions: names tell their keys apart
	for _, d := range dims {
		if d.InFlight == 0 {
			rates++
		}
	}
	seen := map[string]bool{}
	marked, mapped, flights := 0, 0, 0
	for _, d := range dims {
		if d.InFlight != 0 {
			flights++
			switch {
			case flights > 1:
				return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.InFlight", Value: d.Name, Reason: "a shaper has at most one in-flight dimension"}
			case any:
				return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.InFlight", Value: d.Name, Reason: "Any cannot hold a permit for a dimension that did not admit: combine an in-flight dimension with All"}
			case d.Slot:
				return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.Slot", Value: d.Name, Reason: "an in-flight dimension is never the slot dimension (its permits live under their own key)"}
			}
			if seen[d.Name] {
				return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.Name", Value: d.Name, Reason: "names must be unique"}
			}
			seen[d.Name] = true
			continue
		}
		if d.Slot {
			marked++
		}
		if d.Key != nil {
			mapped++
		}
		if rates > 1 && d.Name == "" {
			return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.Name", Value: `""`, Reason: "every dimension of a multi-dimension shaper needs a name"}
		}
		if seen[d.Name] {
			return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.Name", Value: d.Name, Reason: "names must be unique"}
		}
		seen[d.Name] = true
	}
	if marked > 1 {
		return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.Slot", Value: marked, Reason: "at most one dimension may be the slot dimension"}
	}
	if marked == 0 && mapped > 1 {
		return nil, &ConfigError{Algorithm: "shaper", Field: "Dimension.Slot", Value: false, Reason: "several dimensions map the key: mark the broadest one (whose key the others' keys determine) with Slot"}
	}
	s, err := newShaper(store, dims, opts)
	if err != nil {
		return nil, err
	}
	s.any = any && len(s.base.dims) > 1
	s.single = s.single && !s.any
	return s, nil
}

func newShaper(st Store, dims []Dimension, opts []Option) (*Shaper, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	if st == nil || reflect.ValueOf(st).IsNil() { // a nil interface, or a typed nil behind it
		return nil, &ConfigError{Algorithm: "shaper", Field: "Store", Value: fmt.Sprintf("%T(nil)", st), Reason: "must not be nil (use memstore.New or redisstore.New)"}
	}
	if cfg.prefix == "" {
		cfg.prefix = "tk:" + cfg.name + ":"
	}
	b := store.Of(st)
	s := &Shaper{cfg: cfg, store: b, queues: cfg.alg.queues(), remote: b.Remote()}
	s.one, _ = b.(store.OneKey)
	var err error
	base := &contract{maxQueue: cfg.maxQueue}
	for _, spec := range dims {
		if spec.InFlight != 0 {
			if s.flight, err = newFlight(&s.cfg, spec); err != nil {
				return nil, err
			}
			continue
		}
		d, err := newDim(&s.cfg, spec, spec.Rate, cfg.maxQueue)
		if err != nil {
			return nil, err
		}
		if len(base.dims) == 0 {
			s.queues = d.spec.queues()
		} else if d.spec.queues() != s.queues {
			return nil, &ConfigError{Algorithm: d.spec.String(), Field: "Algorithm", Value: d.spec, Reason: "dimensions that queue (LeakyBucket, TrailingWindow) and dimensions that do not cannot be mixed in one shaper"}
		}
		if d.Bound, err = b.Bind(&d.Dim); err != nil {
			return nil, err
		}
		base.dims = append(base.dims, d)
		if spec.Slot || (spec.Key != nil && s.slot == nil) {
			s.slot = d
		}
	}
	// The dimensions in name order: the order they are given in never
	// changes a decision, not even which dimension a tie names as binding.
	slices.SortFunc(base.dims, func(a, b *dim) int { return strings.Compare(a.Name, b.Name) })
	base.index()
	s.single = len(base.dims) == 1 && base.dims[0].key == nil && base.dims[0].cost == nil
	s.rateless = len(base.dims) == 0
	if cfg.learning != nil && !s.rateless {
		s.learner = newLearner(cfg.learning)
	}
	if cfg.horizon > 0 && s.queues {
		s.ahead = &horizon{clock: cfg.clock, span: cfg.horizon, keys: make(map[string]*ahead)}
	}
	s.startLive(base)
	return s, nil
}

// Name returns the name given with WithName.
func (s *Shaper) Name() string {
	if s == nil {
		return ""
	}
	return s.cfg.name
}

// MaxQueue returns the longest wait the shaper grants, as it stands (see
// SetMaxQueue).
func (s *Shaper) MaxQueue() time.Duration {
	if s == nil {
		return 0
	}
	return s.cur.Load().maxQueue
}

// errNilShaper is what every method of a nil *Shaper returns: a typed nil
// behind a Reserver (a missed map lookup in a Route's pick, say) fails each
// call with a *ConfigError instead of panicking.
var errNilShaper = &ConfigError{Algorithm: "shaper", Field: "Shaper", Value: nil, Reason: "method called on a nil *Shaper (use New or All)"}

// nothingToLimit is the request of a multi-dimension shaper whose every
// dimension a request's costs left out: admitted, with nothing to refund.
var nothingToLimit = &store.Request{}

// binding names the dimension that bound m's decision: "pause" for a
// pause, "" for a shaper of one contract.
func binding(m *store.Request) string {
	switch {
	case m == nil || m == nothingToLimit:
		return ""
	case m.Dec.Binding < 0:
		return "pause"
	}
	return m.Dims[m.Dec.Binding].Name
}

// anchor returns the instant a decision asked for at now counts its delay
// from: the one the store names (at: a store deciding on another clock
// that mapped its slot onto the shaper's, see store.Request.Anchor); now
// itself when the store decided on the shaper's clock at now; a clock
// reading taken after the answer when it decided on another clock (see
// Shaper.remote), or when a failure policy decided locally at a later
// instant (after a call that failed).
func (s *Shaper) anchor(now, at time.Time, local bool) time.Time {
	if !at.IsZero() && !local {
		return at
	}
	if s.remote || local {
		return s.cfg.clock.Now()
	}
	return now
}

// reserveOne is the single-key branch's store call, after the cost is
// checked: the store's own single-key step when it has one (store.OneKey:
// no request to build, the decision returned by value), one dimension of
// Reserve on any other. It returns what a Reservation keeps besides the
// decision (see Reservation).
func (s *Shaper) reserveOne(ctx context.Context, d *dim, allow bool, key string, cost int64, ms, limit float64, dec *algorithms.Decision) (g store.Grant, local bool, at time.Time, err error) {
	alg, k := d.Alg, d.Kern
	if allow {
		alg, k = d.Allow, d.KernAllow
	}
	if k == nil || !k.Admissible(cost) { // the GCRA kernel's rule inline; the others' through the interface
		if err := validCost(d, alg, key, cost); err != nil {
			return g, false, at, err
		}
	}
	if s.one != nil {
		*dec, g, err = s.one.ReserveOne(&d.Dim, allow, key, cost, ms, limit)
		return g, false, at, err
	}
	req := store.NewRequest(1, ms, key)
	req.Limit = limit
	req.Dims, req.Algs, req.Keys, req.Costs = append(req.Dims, &d.Dim), append(req.Algs, alg), append(req.Keys, key), append(req.Costs, cost)
	if err := s.store.Reserve(ctx, req); err != nil {
		return g, false, at, err
	}
	*dec = req.Dec.Decision
	g.At = req.At
	if len(req.Tags) > 0 {
		g.Tag = req.Tags[0]
	}
	if len(req.Gens) > 0 { // a local slot's generation
		g.Gen = req.Gens[0]
	}
	if len(req.Seqs) > 0 {
		g.Seq = req.Seqs[0]
	}
	return g, req.Local, req.Anchor, nil
}

// decide runs one transition for key and cost at the clock's now, writing
// the decision to *dec (the caller's zero Decision). It is the one path of
// Reserve, Allow and Wait, on every store; it never sleeps. It returns
// what a Reservation holds besides the decision: the instant the delay
// counts from, the single-key branch's grant (see Settle), whether a
// failure policy granted the slot, and the multi-dimension request
// (nothingToLimit when every dimension was left out).
func (s *Shaper) decide(ctx context.Context, c *contract, key string, cost int64, allow bool, limit float64, dec *algorithms.Decision) (now time.Time, g store.Grant, local bool, m *store.Request, err error) {
	if now, err = s.check(ctx, c, key, cost); err != nil {
		return now, g, false, nil, err
	}
	if s.refresh > 0 { // a Redis store: its fleet's contract, read in the background
		s.refreshAt(now)
	}
	if s.learner != nil { // the learned rate's clamp, renewed
		s.learnSync(ctx, c, key, now)
	}
	ms := algorithms.Millis(now)
	if !s.single {
		m, err = s.decideMulti(ctx, c, key, cost, allow, ms, limit, dec)
		var at time.Time
		if m != nil {
			local, at = m.Local, m.Anchor
		}
		return s.anchor(now, at, local), g, local, m, err
	}
	// The single-key branch: one contract, no mappings (reserveOne).
	var at time.Time
	if !trace.On() { // programs that never trace: no timer, no context lookup
		g, local, at, err = s.reserveOne(ctx, c.dims[0], allow, key, cost, ms, limit, dec)
	} else {
		st := startStore(ctx)
		g, local, at, err = s.reserveOne(ctx, c.dims[0], allow, key, cost, ms, limit, dec)
		st.done("reserve", err)
	}
	return s.anchor(now, at, local), g, local, nil, err
}

// decideMulti is decide for every other shaper: each dimension's key and
// cost mapped, then one transition over all of them in the store.
func (s *Shaper) decideMulti(ctx context.Context, c *contract, key string, cost int64, allow bool, ms, limit float64, dec *algorithms.Decision) (*store.Request, error) {
	req := store.NewRequest(len(c.dims), ms, s.slotOf(key))
	req.Limit, req.Any = limit, s.any
	var refused error // Any: the first cost a dimension could never admit
	cs, err := s.costsOf(ctx, c, key)
	if err != nil {
		return nil, err
	}
	for _, d := range c.dims {
		c, err := mapCost(cs, d, key, cost)
		if err != nil {
			return nil, err
		}
		if c == 0 {
			continue
		}
		k := key
		if d.key != nil {
			k = d.key(key)
			if err := checkKey(k); err != nil {
				return nil, err
			}
		}
		alg := d.Alg
		if allow {
			alg = d.Allow
		}
		never, err := s.admissible(d, alg, k, c)
		if err != nil {
			return nil, err
		}
		if never != nil {
			refused = cmp.Or(refused, never)
			continue
		}
		req.Dims = append(req.Dims, &d.Dim)
		req.Algs = append(req.Algs, alg)
		req.Keys = append(req.Keys, k)
		req.Costs = append(req.Costs, c)
	}
	if len(req.Dims) == 0 {
		if refused != nil { // Any: no dimension could ever admit it
			return nil, refused
		}
		dec.Allowed = true // every dimension left out: nothing to limit
		return nothingToLimit, nil
	}
	st := startStore(ctx)
	err = s.store.Reserve(ctx, req)
	st.done("reserve", err)
	if err != nil {
		return nil, err
	}
	req.KeepTook()
	*dec = req.Dec.Decision
	return req, nil
}

// queueFull builds the refusal for a decision that was not allowed:
// retryAfter past MaxQueue for the leaky bucket, retryAfter itself for the
// algorithms that never queue.
func (s *Shaper) queueFull(c *contract, key string, retryAfter time.Duration, binding string) *QueueFullError {
	maxQueue := time.Duration(0)
	if s.queues {
		maxQueue = c.maxQueue
	}
	return &QueueFullError{Key: key, Dimension: binding, Delay: retryAfter + maxQueue, MaxQueue: maxQueue}
}

// Reserve reserves a slot for cost units on key and returns at once. With the
// leaky bucket, Delay says how long to wait; the other algorithms admit (Delay
// 0) or refuse. A refusal is a *QueueFullError and consumes nothing.
//
// With an in-flight dimension it takes a permit first, only if one is free
// and no request of this process waits for one (else a *QueueFullError
// with InFlight set); the reservation holds it until Release.
func (s *Shaper) Reserve(ctx context.Context, key string, cost int64) (Reservation, error) {
	return s.reserve(ctx, key, cost, noLimit, true) // inlined: the hot path copies no Reservation
}

// noLimit is the limit of a reservation that only MaxQueue bounds.
var noLimit = math.Inf(1)

// reserve is Reserve for a caller that waits at most limit ms (its
// deadline): a slot further away is refused, with a *DeadlineError, before
// anything is written, so that the budget it would have held is not held
// in the meantime by a slot nobody uses. With permits, an in-flight
// dimension's permit is taken first (holding); without, the caller holds
// one already, or has none to take.
func (s *Shaper) reserve(ctx context.Context, key string, cost int64, limit float64, permits bool) (Reservation, error) {
	if s == nil {
		return Reservation{}, errNilShaper
	}
	if permits && s.flight != nil {
		return s.holding(ctx, key, cost, holdReserve)
	}
	var dec algorithms.Decision
	c := s.cur.Load() // s.live(), inlined
	if c.stale() {
		c = s.liveSlow()
	}
	now, g, local, m, err := s.decide(ctx, c, key, cost, false, limit, &dec)
	if err != nil {
		return Reservation{}, err
	}
	if !dec.Allowed {
		if bound := algorithms.Duration(max(limit, 0)); limit < noLimit && s.queues && bound < c.maxQueue {
			wait := dec.RetryAfter + bound
			if wait <= c.maxQueue { // within MaxQueue: the deadline refused it
				dl, _ := ctx.Deadline()
				return Reservation{}, &DeadlineError{Key: key, Delay: wait, Deadline: dl}
			}
			return Reservation{}, s.queueFull(c, key, wait-c.maxQueue, binding(m))
		}
		return Reservation{}, s.queueFull(c, key, dec.RetryAfter, binding(m))
	}
	// Built in place: the hot path copies no Reservation.
	return Reservation{Delay: dec.Delay, s: s, c: c, now: now, rem: dec.Remaining, key: key, cost: cost, g: g, local: local, m: m, done: m == nothingToLimit, once: c.once()}, nil
}

// Allow admits cost units on key only if they may depart now; it never
// waits. A shaper with an in-flight dimension refuses it with a
// *ConfigError: use Reserve, whose reservation can be released.
func (s *Shaper) Allow(ctx context.Context, key string, cost int64) (bool, error) {
	if s == nil {
		return false, errNilShaper
	}
	if s.flight != nil {
		return false, s.errHoldsPermits()
	}
	var dec algorithms.Decision
	_, _, _, _, err := s.decide(ctx, s.live(), key, cost, true, noLimit, &dec)
	return err == nil && dec.Allowed, err
}

// Reset forgets key, in every dimension. On a shaper WithLearning it
// forgets the key's schedule, not what the partner said nor what the
// shaper learned: a pause stays (a Retry-After, "0 remaining until the
// reset"), the learned rate's clamp stays (docs/LEARNING.md), and the key
// departs at its learned rate right after it. The reservations granted before it give
// nothing back (Cancel and a Settle for less do nothing to the schedule
// granted after it, which never counted them; a Settle for more still
// charges its extra): on the leaky bucket and GCRA the key keeps a record
// of that until their terms have passed.
func (s *Shaper) Reset(ctx context.Context, key string) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil { // a done ctx erases nothing
		return err
	}
	if s.rateless { // nothing but permits, which a request holds until it releases
		return nil
	}
	if s.learner != nil {
		st := startStore(ctx)
		err := s.learnReset(ctx, s.live(), key)
		st.done("reset", err)
		return err
	}
	ks, err := s.keys(key)
	if err != nil {
		return err
	}
	st := startStore(ctx)
	err = s.store.Reset(ctx, ks, algorithms.Millis(s.cfg.clock.Now()))
	st.done("reset", err)
	return err
}

// MaxPause is the longest pause accepted.
const MaxPause = 366 * 24 * time.Hour

// Pause holds key for d: nothing reserved from now departs before now+d, and
// waiters take new slots after it. Pausing again extends, never shortens; d
// <= 0 does nothing. Every dimension's key is paused, so the whole fleet
// sharing the store stops (a partner's Retry-After).
func (s *Shaper) Pause(ctx context.Context, key string, d time.Duration) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.rateless { // nothing but permits, which a request holds until it releases
		return nil
	}
	if d <= 0 {
		return nil
	}
	if d > MaxPause {
		return &ConfigError{Algorithm: "shaper", Field: "Pause", Value: d, Reason: fmt.Sprintf("must be at most %v", MaxPause)}
	}
	ks, err := s.keys(key)
	if err != nil {
		return err
	}
	st := startStore(ctx)
	err = s.store.Pause(ctx, ks, algorithms.Millis(s.cfg.clock.Now()), algorithms.DurationMillis(d))
	st.done("pause", err)
	return err
}
