package shaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/internal/trace"
)

// Reserver is what the transport, the queue and otel.Wrap accept: a *Shaper,
// or anything that decorates one.
type Reserver interface {
	Reserve(ctx context.Context, key string, cost int64) (Reservation, error)
	Wait(ctx context.Context, key string, cost int64) error
	Pause(ctx context.Context, key string, d time.Duration) error
}

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
}

// Shaper paces requests per key against a contract: every request reserves a
// departure slot. Its state lives in its Store, so shapers in many processes
// sharing a Redis store share one budget per key. It is safe for concurrent
// use.
type Shaper struct {
	cfg    config
	store  Store
	cur    atomic.Pointer[contract] // the dimensions and MaxQueue in force (see live.go)
	queues bool                     // the leaky bucket: Reserve grants delays

	// mem is the store when it is a MemoryStore: the single-key branch
	// calls it concretely (no interface dispatch, the Decision on the
	// caller's stack).
	mem *MemoryStore
	// remote: the store decides on another clock (a RedisStore on Redis
	// TIME) and answers after a round trip, so a reservation's delay counts
	// from a clock reading taken after the reply: a departure is then never
	// earlier than its slot on the store's timeline, however long the call
	// took. A store on the shaper's own clock (memory, WithClientClock)
	// decides at the now it is given, and the delay counts from that now.
	remote bool
	single bool // one dimension, no Key or Cost mapping
	any    bool // Any: a dimension admitting is enough (algorithms.AnyWithin)
	slot   *dim // the dimension whose key is the hash slot (nil: the caller's key); see Dimension.Slot

	liveState // changing the contract while it runs (live.go)
}

var _ Reserver = (*Shaper)(nil)

// dim is one resolved dimension.
type dim struct {
	// The hot path's fields first, on one cache line: the store's data for
	// this dimension and the GCRA kernels, which kern and kernAllow point into.
	bound     any // what Store.bind returned: the store's own, opaque to the shaper
	kernels   [2]gcra.Kernel
	kern      *gcra.Kernel // alg's GCRA kernel; non-nil when Cancel can refund
	kernAllow *gcra.Kernel // allow's

	name     string
	prefix   string // the namespace of its keys in the store
	identity string // algorithm, rate and MaxQueue, to detect conflicting shapers on one prefix
	alg      algorithms.Algorithm
	allow    algorithms.Algorithm
	key      func(string) string
	cost     func(int64) int64
	base     string    // the shaper's prefix (prefix is base + name + ":")
	spec     Algorithm // how alg was built, so that a store can build a scaled copy
	rate     Rate
	maxQueue time.Duration
	clock    Clock // the shaper's clock, for a decision a store makes locally

}

// setKernels points kern and kernAllow at d's own copies of the GCRA
// kernels of alg and allow (nil for the other algorithms).
func (d *dim) setKernels() {
	d.kern, d.kernAllow = nil, nil
	if k := kernelOf(d.alg); k != nil {
		d.kernels[0] = *k
		d.kern = &d.kernels[0]
	}
	if k := kernelOf(d.allow); k != nil {
		d.kernels[1] = *k
		d.kernAllow = &d.kernels[1]
	}
}

// New returns a shaper of one contract over store: by default the leaky
// bucket, with MaxQueue DefaultMaxQueue.
func New(store Store, rate Rate, opts ...Option) (*Shaper, error) {
	return newShaper(store, []Dimension{{Rate: rate}}, opts)
}

// All returns a shaper of several contracts at once: a request departs at the
// earliest instant every dimension allows, and consumes in all or in none;
// the order of dims never matters; at most MaxDimensions. An LLM API's 3,500 requests and 90,000
// tokens per minute, reserving each call's tokens as its cost:
//
//	shaper.All(store, []shaper.Dimension{
//		{Name: "requests", Rate: shaper.PerMinute(3500), Cost: func(int64) int64 { return 1 }},
//		{Name: "tokens", Rate: shaper.PerMinute(90000).WithBurst(90000)},
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
	seen := map[string]bool{}
	marked, mapped := 0, 0
	for _, d := range dims {
		if d.Slot {
			marked++
		}
		if d.Key != nil {
			mapped++
		}
		if len(dims) > 1 && d.Name == "" {
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

func newShaper(store Store, dims []Dimension, opts []Option) (*Shaper, error) {
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	switch st := store.(type) { // a nil interface, or a typed nil behind it
	case nil:
		return nil, &ConfigError{Algorithm: "shaper", Field: "Store", Value: nil, Reason: "must not be nil (use NewMemoryStore)"}
	case *MemoryStore:
		if st == nil {
			return nil, &ConfigError{Algorithm: "shaper", Field: "Store", Value: "(*MemoryStore)(nil)", Reason: "must not be nil (use NewMemoryStore)"}
		}
	case *RedisStore:
		if st == nil {
			return nil, &ConfigError{Algorithm: "shaper", Field: "Store", Value: "(*RedisStore)(nil)", Reason: "must not be nil (use NewRedisStore)"}
		}
	}
	if cfg.prefix == "" {
		cfg.prefix = "tk:" + cfg.name + ":"
	}
	s := &Shaper{cfg: cfg, store: store, queues: cfg.alg.kind == kindLeaky}
	base := &contract{maxQueue: cfg.maxQueue}
	for _, spec := range dims {
		alg, allow, err := cfg.alg.build(spec.Rate, cfg.maxQueue)
		if err != nil {
			return nil, err
		}
		d := &dim{
			name:     spec.Name,
			prefix:   cfg.prefix,
			identity: fmt.Sprintf("%v %v maxqueue=%v", cfg.alg, spec.Rate, cfg.maxQueue),
			alg:      alg,
			allow:    allow,
			key:      spec.Key,
			cost:     spec.Cost,
			base:     cfg.prefix,
			spec:     cfg.alg,
			rate:     spec.Rate,
			maxQueue: cfg.maxQueue,
			clock:    cfg.clock,
		}
		if spec.Name != "" {
			d.prefix += spec.Name + ":"
		}
		d.setKernels()
		if d.bound, err = store.bind(d); err != nil {
			return nil, err
		}
		base.dims = append(base.dims, d)
		if spec.Slot || (spec.Key != nil && s.slot == nil) {
			s.slot = d
		}
	}
	// The dimensions in name order: the order they are given in never
	// changes a decision, not even which dimension a tie names as binding.
	slices.SortFunc(base.dims, func(a, b *dim) int { return strings.Compare(a.name, b.name) })
	s.single = len(base.dims) == 1 && base.dims[0].key == nil && base.dims[0].cost == nil
	if rs, ok := store.(*RedisStore); ok {
		s.remote = !rs.clientClock
	}
	s.mem, _ = store.(*MemoryStore)
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

// Reservation is a departure slot granted by Reserve: depart at Time(), or
// Cancel.
type Reservation struct {
	// Delay is how long to wait before departing; 0 means at once.
	Delay time.Duration

	s     *Shaper
	c     *contract // the contract it was granted under: it gives back under that one
	now   time.Time // when it was granted: it departs at now + Delay
	rem   int64     // Remaining
	key   string
	cost  int64
	tag   float64
	seq   float64 // its sequence number in its key's Ledger (0: none; see gcra.Ledger)
	at    float64 // its departure in ms on the store's timeline (0: unknown)
	m     *multi
	gen   uint32 // the store's generation of the slot (see MemoryStore.settle)
	local bool   // granted by the Redis store's failure policy
	done  bool
}

// Time returns the departure instant, on Clock. A Reservation no shaper
// granted (one a custom Reserver built with Delay alone) departs Delay from
// the call, on the system clock.
func (r *Reservation) Time() time.Time {
	if r.s == nil {
		return timer.Real().Now().Add(r.Delay)
	}
	return r.now.Add(r.Delay)
}

// Remaining is how many units could still depart at once on r's key
// right after r was granted, as Status would have reported it then, in the
// units of the dimension that bound r (chosen by Status's rule); at most 1
// while a partner's clamp holds the key (see Clamp). It is 0
// for a reservation a failure policy granted unpaced (FailOpen) and for
// one no shaper granted.
func (r *Reservation) Remaining() int64 { return r.rem }

// Clock returns the clock of the shaper that granted r (the system clock for
// the zero Reservation), so that a scheduler waits for Time on it.
func (r *Reservation) Clock() Clock {
	if r.s == nil {
		return timer.Real()
	}
	return r.s.cfg.clock
}

// Cancel gives the slot back, if its time has not come: the caller will not
// depart. What the key's schedule can take back without breaking the
// contract it takes (all of it when nothing was reserved after it); on a
// shaper of one contract, the rest is handed to the next reservation that
// can depart at that very instant. After the slot's time it does nothing
// (the caller may have departed), and the reservation can still be settled
// with what it used. A done ctx returns ctx.Err() and changes nothing. A
// reservation is cancelled or settled once; only the leaky bucket and GCRA
// give back.
func (r *Reservation) Cancel(ctx context.Context) error {
	if r.s == nil || r.done {
		return nil
	}
	if err := ctx.Err(); err != nil { // nothing happens: a later call may still cancel
		return err
	}
	if r.s.cfg.clock.Now().After(r.Time()) { // the caller may have departed: Settle still can
		return nil
	}
	r.done = true
	if err := r.giveBack(ctx, "cancel", -1); err != nil {
		r.done = false // the store refused or failed: a retry may give it back (once: the store dedupes)
		return err
	}
	return nil
}

// Settle records what the call that used r actually cost, once it is known
// (an LLM API's tokens, a GraphQL query's points): reserve an estimate, call,
// then settle. Less than reserved gives the difference back to the key, as
// far as the reservations made after it allow without breaking the contract
// (docs/GUARANTEES.md says how far); more is charged at once, so that later
// reservations wait for it; it is never refused, the call has happened. A
// multi-dimension shaper maps actual through each dimension's Cost, as
// Reserve mapped the estimate (a request count stays 1). A reservation is
// settled or cancelled once, however many copies of it are settled or
// cancelled. Only the leaky bucket and GCRA give back; the other algorithms
// keep what they counted and charge an extra at the instant it is settled.
// An extra is charged even once the key has gone idle (its Redis key
// expired). An actual cost whose extra would hold the key back longer than
// MaxOverrun is a *CostError, and a done ctx returns ctx.Err(): nothing is
// recorded then, and a later Settle may still settle it.
func (r *Reservation) Settle(ctx context.Context, actual int64) error {
	if actual < 0 {
		return &CostError{Algorithm: "settle", Cost: actual, Reason: "the actual cost must be >= 0", Key: r.key}
	}
	if r.s == nil || r.done {
		return nil
	}
	if err := ctx.Err(); err != nil { // nothing is recorded: a retry with a live ctx settles
		return err
	}
	r.done = true
	// Even settled at its cost, the store records it: a copy of r cancelled
	// later must find it settled.
	if err := r.giveBack(ctx, "settle", actual); err != nil {
		r.done = false // refused or failed: a retry may settle it (once: the store dedupes)
		return err
	}
	return nil
}

// MaxOverrun is the longest a settle may hold a key back for what a call
// cost beyond its reservation: the charge of the extra units at the
// dimension's rate (Period/Count per unit). A larger actual cost is a
// *CostError and records nothing; it is almost always a unit mistake (bytes
// for kilobytes) that would block the key for years.
const MaxOverrun = MaxPause

// checkOverrun refuses an actual cost of d's units whose extra over cost
// would charge more than MaxOverrun, or that float64 cannot hold exactly.
func checkOverrun(d *dim, key string, cost, actual int64) error {
	if actual <= cost {
		return nil
	}
	per := d.rate.Period.Seconds() / float64(d.rate.Count) // seconds a unit
	if actual > gcra.MaxExactCost || float64(actual-cost)*per > MaxOverrun.Seconds() {
		return &CostError{Algorithm: d.alg.Name(), Cost: actual, Key: key, Dimension: d.name,
			Reason: fmt.Sprintf("the actual cost would charge %.3g s beyond the reservation at %v, more than MaxOverrun (%v)", float64(actual-cost)*per, d.rate, MaxOverrun)}
	}
	return nil
}

// giveBack hands a cancel (actual -1) or a settle to the store, for the
// dimensions of the GCRA family that took part in r.
func (r *Reservation) giveBack(ctx context.Context, op string, actual int64) error {
	s := r.s
	st := &settlement{at: r.at, now: algorithms.Millis(s.cfg.clock.Now()), local: r.local}
	if r.m != nil {
		st.keyset, st.tags, st.gens, st.seqs, st.costs = r.m.keyset, r.m.tags, r.m.gens, r.m.seqs, r.m.costs
		st.at = r.m.at
		if actual >= 0 {
			st.actual = make([]int64, len(r.m.dims))
			for i, d := range r.m.dims {
				st.actual[i] = actual
				if d.cost != nil {
					if st.actual[i] = d.cost(actual); st.actual[i] < 0 {
						return &CostError{Algorithm: d.alg.Name(), Cost: st.actual[i], Key: r.key, Dimension: d.name, Reason: fmt.Sprintf("the dimension's Cost mapped the actual cost %d to a negative cost", actual)}
					}
				}
				if err := checkOverrun(d, r.m.keys[i], r.m.costs[i], st.actual[i]); err != nil {
					return err
				}
			}
		}
	} else {
		if r.c.dims[0].kern == nil && actual <= r.cost { // the other algorithms only take an extra
			return nil
		}
		if actual >= 0 {
			if err := checkOverrun(r.c.dims[0], r.key, r.cost, actual); err != nil {
				return err
			}
		}
		st.keyset = keyset{dims: r.c.dims[:1], keys: []string{r.key}, slot: r.key}
		st.tags, st.gens, st.seqs, st.costs = []float64{r.tag}, []uint32{r.gen}, []float64{r.seq}, []int64{r.cost}
		st.holes = true
		if actual >= 0 {
			st.actual = []int64{actual}
		}
	}
	if len(st.tags) != len(st.dims) { // FailOpen granted it: nothing was counted
		return nil
	}
	if cur := s.cur.Load(); cur != r.c {
		// Granted under a contract changed since: the key is settled in the
		// contract in force, whose schedule it holds now (a settle written
		// under the old one would tag the key with it). Its refund rule
		// knows nothing of a slot granted under another contract, so an
		// extra is charged and nothing is given back (sequence number -1).
		extra := false
		for i, a := range st.actual {
			extra = extra || a > st.costs[i]
		}
		if !extra {
			return nil
		}
		st.dims = inContract(st.dims, cur)
		st.seqs = slices.Repeat([]float64{-1}, len(st.dims))
	}
	t := startStore(ctx)
	err := s.store.settle(ctx, st)
	t.done(op, err)
	return err
}

// inContract returns dims as contract c has them (by name), in a new slice.
func inContract(dims []*dim, c *contract) []*dim {
	out := make([]*dim, len(dims))
	for i, d := range dims {
		out[i] = d
		for _, cd := range c.dims {
			if cd.name == d.name {
				out[i] = cd
			}
		}
	}
	return out
}

// nothingToLimit is the request of a multi-dimension shaper whose every
// dimension a request's costs left out: admitted, with nothing to refund.
var nothingToLimit = &multi{}

// binding names the dimension that bound m's decision: "pause" for a
// pause, "" for a shaper of one contract.
func binding(m *multi) string {
	switch {
	case m == nil || m == nothingToLimit:
		return ""
	case m.dec.Binding < 0:
		return "pause"
	}
	return m.dims[m.dec.Binding].name
}

// check validates what every method is given and reads the clock once.
func (s *Shaper) check(ctx context.Context, c *contract, key string, cost int64) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	if err := checkKey(key); err != nil {
		return time.Time{}, err
	}
	if cost < 1 {
		return time.Time{}, &CostError{Algorithm: c.dims[0].alg.Name(), Cost: cost, Reason: "must be >= 1", Key: key, Dimension: c.dims[0].name}
	}
	return s.cfg.clock.Now(), nil
}

// validCost checks cost against d's admissibility rule before any store is
// asked, so that every store gives the same answer, and a cost that can
// never be admitted is refused before a round trip (the Redis scripts check
// it again and refuse without writing).
func validCost(d *dim, alg algorithms.Algorithm, key string, cost int64) error {
	if err := alg.ValidateCost(cost); err != nil {
		return nameCost(err, d, key)
	}
	return nil
}

// nameCost names the key and d's dimension in a *CostError, as every store
// and path names them; any other error is returned as it is.
func nameCost(err error, d *dim, key string) error {
	var ce *CostError
	if errors.As(err, &ce) {
		return &CostError{Algorithm: ce.Algorithm, Cost: ce.Cost, Reason: ce.Reason, Key: key, Dimension: d.name}
	}
	return err
}

// anchor returns the instant a decision asked for at now counts its delay
// from: now itself when the store decided on the shaper's clock at now; a
// clock reading taken after the answer when it decided on another clock
// (see Shaper.remote), or when a failure policy decided locally at a later
// instant (after a call that failed).
func (s *Shaper) anchor(now time.Time, local bool) time.Time {
	if s.remote || local {
		return s.cfg.clock.Now()
	}
	return now
}

// reserveOne is the single-key branch's store call, after the cost is
// checked: concrete on a MemoryStore (MemoryStore.reserve), one dimension
// of reserveAll on any other. It returns what a Reservation keeps besides
// the decision (see Reservation).
func (s *Shaper) reserveOne(ctx context.Context, d *dim, allow bool, key string, cost int64, ms, limit float64, dec *algorithms.Decision) (tag float64, gen uint32, seq, at float64, local bool, err error) {
	alg, k := d.alg, d.kern
	if allow {
		alg, k = d.allow, d.kernAllow
	}
	var within gcra.Kernel
	if k != nil && limit < k.MaxWait { // the caller's deadline comes first: the kernel waits no longer
		within = *k
		within.MaxWait = max(limit, 0)
		k = &within
	}
	if k == nil || !k.Admissible(cost) { // the GCRA kernel's rule inline; the others' through the interface
		if err := validCost(d, alg, key, cost); err != nil {
			return 0, 0, 0, 0, false, err
		}
	}
	if s.mem == nil {
		return s.reserveStore(ctx, d, alg, key, cost, ms, limit, dec)
	}
	if k != nil { // the leaky bucket and GCRA: the kernel on a bare TAT
		tag, gen, seq, at, err = s.mem.reserveTAT(d, k, key, cost, ms, dec)
	} else {
		tag, gen, err = s.mem.reserve(d, alg, key, cost, ms, dec)
	}
	return tag, gen, seq, at, false, err
}

// reserveStore is reserveOne on a store other than a MemoryStore: one
// dimension of reserveAll.
func (s *Shaper) reserveStore(ctx context.Context, d *dim, alg algorithms.Algorithm, key string, cost int64, ms, limit float64, dec *algorithms.Decision) (tag float64, gen uint32, seq, at float64, local bool, err error) {
	req := newMulti(1, ms, key)
	req.limit = limit
	req.dims, req.algs, req.keys, req.costs = append(req.dims, d), append(req.algs, alg), append(req.keys, key), append(req.costs, cost)
	if err := s.store.reserveAll(ctx, req); err != nil {
		return 0, 0, 0, 0, false, err
	}
	*dec = req.dec.Decision
	if len(req.tags) > 0 {
		tag = req.tags[0]
	}
	if len(req.gens) > 0 { // a local slot's generation
		gen = req.gens[0]
	}
	if len(req.seqs) > 0 {
		seq = req.seqs[0]
	}
	return tag, gen, seq, req.at, req.local, nil
}

// decide runs one transition for key and cost at the clock's now, writing
// the decision to *dec (the caller's zero Decision). It is the one path of
// Reserve, Allow and Wait, on every store; it never sleeps. It returns what
// a Reservation holds besides the decision, as scalars that travel in
// registers (a struct of them is copied through the stack): the instant the
// delay counts from, the single-key branch's tag, generation, sequence
// number and departure (see Settle), whether a failure policy granted the
// slot, and the multi-dimension request (nothingToLimit when every
// dimension was left out).
func (s *Shaper) decide(ctx context.Context, c *contract, key string, cost int64, allow bool, limit float64, dec *algorithms.Decision) (now time.Time, tag float64, gen uint32, seq, at float64, local bool, m *multi, err error) {
	if now, err = s.check(ctx, c, key, cost); err != nil {
		return now, 0, 0, 0, 0, false, nil, err
	}
	if s.refresh > 0 { // a RedisStore: its fleet's contract, read in the background
		s.refreshAt(now)
	}
	ms := algorithms.Millis(now)
	if !s.single {
		m, err = s.decideMulti(ctx, c, key, cost, allow, ms, limit, dec)
		if m != nil {
			local = m.local
		}
		return s.anchor(now, local), 0, 0, 0, 0, local, m, err
	}
	// The single-key branch: one contract, no mappings; on a memory store
	// it calls the GCRA kernel directly (reserveOne).
	if !trace.On() { // programs that never trace: no timer, no context lookup
		tag, gen, seq, at, local, err = s.reserveOne(ctx, c.dims[0], allow, key, cost, ms, limit, dec)
	} else {
		st := startStore(ctx)
		tag, gen, seq, at, local, err = s.reserveOne(ctx, c.dims[0], allow, key, cost, ms, limit, dec)
		st.done("reserve", err)
	}
	return s.anchor(now, local), tag, gen, seq, at, local, nil, err
}

// decideMulti is decide for every other shaper: each dimension's key and
// cost mapped, then one transition over all of them in the store.
func (s *Shaper) decideMulti(ctx context.Context, c *contract, key string, cost int64, allow bool, ms, limit float64, dec *algorithms.Decision) (*multi, error) {
	req := newMulti(len(c.dims), ms, s.slotOf(key))
	req.limit, req.any = limit, s.any
	var refused error // Any: the first cost a dimension could never admit
	for _, d := range c.dims {
		c, err := mapCost(d, key, cost)
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
		alg := d.alg
		if allow {
			alg = d.allow
		}
		never, err := s.admissible(d, alg, k, c)
		if err != nil {
			return nil, err
		}
		if never != nil {
			refused = cmp.Or(refused, never)
			continue
		}
		req.dims = append(req.dims, d)
		req.algs = append(req.algs, alg)
		req.keys = append(req.keys, k)
		req.costs = append(req.costs, c)
	}
	if len(req.dims) == 0 {
		if refused != nil { // Any: no dimension could ever admit it
			return nil, refused
		}
		dec.Allowed = true // every dimension left out: nothing to limit
		return nothingToLimit, nil
	}
	st := startStore(ctx)
	err := s.store.reserveAll(ctx, req)
	st.done("reserve", err)
	if err != nil {
		return nil, err
	}
	req.keepTook()
	*dec = req.dec.Decision
	return req, nil
}

// mapCost maps cost through d's Cost (nil: unchanged): 0 leaves d out of
// the request, and a negative cost is a *CostError.
func mapCost(d *dim, key string, cost int64) (int64, error) {
	if d.cost == nil {
		return cost, nil
	}
	c := d.cost(cost)
	if c < 0 {
		return 0, &CostError{Algorithm: d.alg.Name(), Cost: c, Key: key, Dimension: d.name, Reason: fmt.Sprintf("the dimension's Cost mapped cost %d to a negative cost", cost)}
	}
	return c, nil
}

// admissible checks c against alg on d's key dimKey: a cost alg could never
// admit is an error for All; for Any it only leaves d out (never), since
// another dimension may admit it.
func (s *Shaper) admissible(d *dim, alg algorithms.Algorithm, dimKey string, c int64) (never, err error) {
	if err := validCost(d, alg, dimKey, c); err != nil {
		if s.any {
			return err, nil
		}
		return nil, err
	}
	return nil, nil
}

func checkKey(key string) error {
	if len(key) > MaxKeyLen {
		return &KeyError{Key: key[:64], Len: len(key), Reason: fmt.Sprintf("longer than MaxKeyLen (%d bytes)", MaxKeyLen)}
	}
	return nil
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
func (s *Shaper) Reserve(ctx context.Context, key string, cost int64) (Reservation, error) {
	return s.reserve(ctx, key, cost, noLimit)
}

// noLimit is the limit of a reservation that only MaxQueue bounds.
var noLimit = math.Inf(1)

// reserve is Reserve for a caller that waits at most limit ms (its
// deadline): a slot further away is refused, with a *DeadlineError, before
// anything is written, so that the budget it would have held is not held
// in the meantime by a slot nobody uses.
func (s *Shaper) reserve(ctx context.Context, key string, cost int64, limit float64) (Reservation, error) {
	if s == nil {
		return Reservation{}, errNilShaper
	}
	var dec algorithms.Decision
	c := s.cur.Load() // s.live(), inlined
	if c.stale() {
		c = s.liveSlow()
	}
	now, tag, gen, seq, at, local, m, err := s.decide(ctx, c, key, cost, false, limit, &dec)
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
	return Reservation{Delay: dec.Delay, s: s, c: c, now: now, rem: dec.Remaining, key: key, cost: cost, tag: tag, seq: seq, at: at, gen: gen, local: local, m: m, done: m == nothingToLimit}, nil
}

// Allow admits cost units on key only if they may depart now; it never waits.
func (s *Shaper) Allow(ctx context.Context, key string, cost int64) (bool, error) {
	if s == nil {
		return false, errNilShaper
	}
	var dec algorithms.Decision
	_, _, _, _, _, _, _, err := s.decide(ctx, s.live(), key, cost, true, noLimit, &dec)
	return err == nil && dec.Allowed, err
}

// Wait reserves cost units on key and sleeps until their slot. A slot past
// ctx's deadline is refused at once with a *DeadlineError, and nothing is
// taken; if ctx ends while sleeping, the slot is given back (see Cancel) and
// ctx.Err() returned. A request
// whose key is paused while it sleeps takes a new slot after the pause. For
// algorithms other than the leaky bucket, Wait sleeps until the request
// would be admitted and retries, for at most MaxQueue.
func (s *Shaper) Wait(ctx context.Context, key string, cost int64) error {
	_, err := s.Acquire(ctx, key, cost)
	return err
}

// Acquire is Wait that returns the reservation the request departs on, to
// Settle once the call's actual cost is known:
//
//	r, err := s.Acquire(ctx, "account-42", estimate)
//	...call, and read its usage...
//	_ = r.Settle(ctx, used)
//
// For the algorithms that do not queue it returns the admission it got
// (Delay 0), which can be settled too.
func (s *Shaper) Acquire(ctx context.Context, key string, cost int64) (Reservation, error) {
	if s == nil {
		return Reservation{}, errNilShaper
	}
	if !s.queues {
		return s.waitRetry(ctx, key, cost)
	}
	// A pause set or extended while we wait: the slot fell inside it and is
	// lost with it; take a new one after the pause, as often as pauses keep
	// coming (MaxQueue and the ctx's deadline bound the wait: reserve
	// refuses a slot past them).
	for {
		limit := noLimit
		if dl, ok := ctx.Deadline(); ok {
			limit = algorithms.DurationMillis(time.Until(dl))
		}
		r, err := s.reserve(ctx, key, cost, limit)
		if err != nil {
			return Reservation{}, err
		}
		if r.Delay <= 0 {
			return r, nil
		}
		paused, err := s.sleepChecking(ctx, key, r)
		if err != nil {
			return Reservation{}, err
		}
		if !paused {
			return r, nil
		}
	}
}

// pauseLead is how long before a slot Wait asks a remote store whether the
// key was paused while it slept.
const pauseLead = 5 * time.Millisecond

// sleepChecking sleeps until r's slot and reports whether the key was paused
// while it slept (a partner's Retry-After seen by another process, say). Its
// slot then fell inside the pause and is lost with it: Wait reserves a new
// one, which the pause places after its end, and sleeps until that. So
// requests held by a pause leave paced after it, not all together when it
// ends.
//
// The check costs one read per request that actually waited. In memory it is
// a map lookup at the slot. A remote store is asked pauseLead before the
// slot, with the slot as the answer's deadline: the answer never delays the
// departure, so a stalled server cannot make departures late and bunch them
// after the stall (a pause set in the last pauseLead is not seen). A failed
// or late read does not fail the request, whose slot is already granted.
func (s *Shaper) sleepChecking(ctx context.Context, key string, r Reservation) (bool, error) {
	if !s.remote || r.Delay <= pauseLead {
		if err := s.sleepReserved(ctx, key, r); err != nil {
			return false, err
		}
		return !s.remote && s.pausedPast(ctx, key, s.cfg.clock.Now(), 0), nil
	}
	if dl, ok := ctx.Deadline(); ok && r.Delay > time.Until(dl) {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return false, &DeadlineError{Key: key, Delay: r.Delay, Deadline: dl}
	}
	if err := s.sleepUntil(ctx, r.Time().Add(-pauseLead)); err != nil {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return false, err
	}
	askCtx, cancel := context.WithDeadline(ctx, r.Time())
	now := s.cfg.clock.Now()
	paused := s.pausedPast(askCtx, key, now, r.Time().Sub(now))
	cancel()
	if err := s.sleepReserved(ctx, key, r); err != nil {
		return false, err
	}
	return paused, nil
}

// pausedPast reports whether a pause on key, read at now, lasts past
// now + d (a slot d away: a pause that ends before it leaves it alone), as
// the store says; a failed read says no.
func (s *Shaper) pausedPast(ctx context.Context, key string, now time.Time, d time.Duration) bool {
	ks, err := s.keys(key)
	if err != nil {
		return false
	}
	st := startStore(ctx)
	left, err := s.store.pauseLeft(ctx, ks, algorithms.Millis(now))
	st.done("pause_left", err)
	return err == nil && left > algorithms.DurationMillis(max(d, 0))
}

// sleepReserved sleeps until r's slot; if the slot falls past ctx's deadline,
// or ctx ends first, it gives the slot back and fails. It may be called
// part of the way to the slot (sleepChecking): what is left to wait is
// measured now, not r.Delay, which counts from the grant.
func (s *Shaper) sleepReserved(ctx context.Context, key string, r Reservation) error {
	if r.Delay <= 0 {
		return nil
	}
	left := r.Time().Sub(s.cfg.clock.Now())
	if left <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && left > time.Until(dl) {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return &DeadlineError{Key: key, Delay: left, Deadline: dl}
	}
	if err := s.sleepUntil(ctx, r.Time()); err != nil {
		_ = r.Cancel(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// waitRetry serves Wait for the algorithms that cannot hold a slot.
func (s *Shaper) waitRetry(ctx context.Context, key string, cost int64) (Reservation, error) {
	start := s.cfg.clock.Now()
	for {
		var dec algorithms.Decision
		c := s.live()
		now, tag, gen, seq, at, local, m, err := s.decide(ctx, c, key, cost, false, noLimit, &dec)
		if err != nil {
			return Reservation{}, err
		}
		if dec.Allowed {
			return Reservation{s: s, c: c, now: now, rem: dec.Remaining, key: key, cost: cost, tag: tag, seq: seq, at: at, gen: gen, local: local, m: m, done: m == nothingToLimit}, nil
		}
		retry := dec.RetryAfter
		if waited := now.Sub(start); waited+retry > c.maxQueue {
			return Reservation{}, &QueueFullError{Key: key, Dimension: binding(m), Delay: waited + retry, MaxQueue: c.maxQueue}
		}
		if dl, ok := ctx.Deadline(); ok && retry > time.Until(dl) {
			return Reservation{}, &DeadlineError{Key: key, Delay: retry, Deadline: dl}
		}
		if err := s.sleepUntil(ctx, now.Add(retry+jitter(retry))); err != nil {
			return Reservation{}, err
		}
	}
}

// jitter spreads retries of waiters that were refused together: up to an
// eighth of the wait, at most 50 ms, and at least 1 µs so that a retry always
// lands after the instant it was told.
func jitter(wait time.Duration) time.Duration {
	j := min(wait/8, 50*time.Millisecond)
	return time.Microsecond + time.Duration(rand.Int64N(int64(j)+1))
}

func (s *Shaper) sleepUntil(ctx context.Context, t time.Time) error {
	if s.cfg.precise > 0 {
		return timer.SleepUntilPrecise(ctx, s.cfg.clock, t, s.cfg.precise)
	}
	return timer.SleepUntil(ctx, s.cfg.clock, t)
}

// Reset forgets key, in every dimension.
func (s *Shaper) Reset(ctx context.Context, key string) error {
	if s == nil {
		return errNilShaper
	}
	if err := ctx.Err(); err != nil { // a done ctx erases nothing
		return err
	}
	ks, err := s.keys(key)
	if err != nil {
		return err
	}
	st := startStore(ctx)
	err = s.store.reset(ctx, ks)
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
	err = s.store.pause(ctx, ks, algorithms.Millis(s.cfg.clock.Now()), algorithms.DurationMillis(d))
	st.done("pause", err)
	return err
}

// keys maps key to every dimension's key, in the contract in force.
func (s *Shaper) keys(key string) (keyset, error) {
	return s.keysOf(s.cur.Load(), key)
}

// keysOf is keys in contract c.
func (s *Shaper) keysOf(c *contract, key string) (keyset, error) {
	if err := checkKey(key); err != nil {
		return keyset{}, err
	}
	keys := make([]string, len(c.dims))
	for i, d := range c.dims {
		keys[i] = key
		if d.key != nil {
			keys[i] = d.key(key)
			if err := checkKey(keys[i]); err != nil {
				return keyset{}, err
			}
		}
	}
	return keyset{dims: c.dims, keys: keys, slot: s.slotOf(key)}, nil
}

// slotOf returns the key whose hash slot holds every key of a request on
// key: the slot dimension's key (see Dimension.Slot).
func (s *Shaper) slotOf(key string) string {
	if s.slot == nil || s.slot.key == nil {
		return key
	}
	return s.slot.key(key)
}
