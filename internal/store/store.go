// Package store is the contract between package shaper and its stores
// (memstore, redisstore): what a store is asked to do, in the shaper's
// terms, and the narrow description of a dimension it reads. It is sealed:
// a store is a value of this module's store packages, recognised by the
// unexported method of Provider, which no other module can implement.
package store

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// The sentinels package shaper re-exports (shaper.ErrStoreUnavailable,
// shaper.ErrInvalidState): every store's errors match them.
var (
	ErrUnavailable  = errors.New("throttlekit: store unavailable")
	ErrInvalidState = errors.New("throttlekit: stored state cannot be used")
)

// Backend is what a store does for the shapers bound to it. Times are ms on
// the shaper's clock (a store on another clock, Remote, measures from its
// own now).
type Backend interface {
	// Bind registers one dimension of a shaper and returns the store's own
	// data for it, which the shaper keeps in d.Bound and never reads.
	Bind(d *Dim) (any, error)
	// Rebind registers d again, a dimension of a contract changed live
	// (d.Bound is the store's data for it under the contract before).
	Rebind(d *Dim) (any, error)
	// Reserve runs one transition over one key per dimension, all or nothing.
	Reserve(ctx context.Context, req *Request) error
	// Settle gives back what a reservation of the GCRA family did not use,
	// as far as its key's schedule allows, and charges an overrun.
	Settle(ctx context.Context, st *Settlement) error
	// Pause holds every departure on the keys for d ms from now.
	Pause(ctx context.Context, ks KeySet, now, d float64) error
	// Clamp sets a partner's clamp on the keys: until now + span,
	// departures at least interval ms apart. With keepTighter it merges
	// with the clamp in force: the one spacing departures further apart
	// holds, until the later of the two ends.
	Clamp(ctx context.Context, ks KeySet, now, interval, span float64, keepTighter bool) error
	// Status reads the keys' standing without changing anything.
	Status(ctx context.Context, q *Query) error
	// PauseLeft returns how many ms remain of the longest pause on the keys.
	PauseLeft(ctx context.Context, ks KeySet, now float64) (float64, error)
	// Reset forgets the keys' schedules and pauses at now (their clamps
	// too). A key of the GCRA family whose reservations granted before may
	// still be cancelled or settled keeps a Ledger that gives them nothing
	// back (gcra.Kernel.ResetLedger).
	Reset(ctx context.Context, ks KeySet, now float64) error
	// ReadContract returns the live contract recorded for the shapers under
	// prefix (the zero Record when none).
	ReadContract(ctx context.Context, prefix string) (Record, error)
	// WriteContract records one change of that contract (Record.Merge) and
	// returns the record after it.
	WriteContract(ctx context.Context, prefix, identity, field, value string) (Record, error)
	// Remote reports whether the store decides on another clock and
	// answers after a round trip (Redis TIME): a reservation's delay then
	// counts from a clock reading taken after the reply.
	Remote() bool
	// Watch returns the version of prefix's live contract, which any
	// shaper under the prefix may change and the store updates at once;
	// nil when the store cannot tell (the shaper then reads the record in
	// the background, every refresh interval).
	Watch(prefix string) *atomic.Uint64
	// Permits: the in-flight dimension's leases.
	Permits
	// FairTurns: the turns of the flows waiting on a key.
	FairTurns
	// Learning: what the shapers learned of each partner key.
	Learning
}

// OneKey is the capability of a store that decides one dimension on one
// key in process: the single-key branch of a shaper calls it with no
// request to build and the decision returned by value.
type OneKey interface {
	// ReserveOne reserves cost on key in d, on d's Allow form when allow,
	// waiting at most limit ms (+Inf: MaxQueue alone).
	ReserveOne(d *Dim, allow bool, key string, cost int64, now, limit float64) (algorithms.Decision, Grant, error)
}

// Seeder is the capability of a store that can continue another store's
// schedule: redisstore's FailLocal twin keeps level with Redis through it.
type Seeder interface {
	// Seed raises key's TAT in d (the GCRA family) to at least tat.
	Seed(d *Dim, key string, tat, now float64)
}

// Grant is what a store returns of an admitted reservation on one key,
// besides the decision: the tag, generation and sequence number that let
// it give back (see Settlement), and its departure on the store's timeline.
type Grant struct {
	Tag float64
	Gen uint32
	Seq float64
	At  float64
}

// Provider is a store of this module: shaper.Store. Only a type that embeds
// a Handle has its method.
type Provider interface{ backend() Backend }

// Handle is what a store embeds (under an unexported name) to be a
// Provider for its backend.
type Handle struct{ b Backend }

// NewHandle returns the Handle of b.
func NewHandle(b Backend) Handle { return Handle{b: b} }

func (h *Handle) backend() Backend { return h.b }

// Of returns p's backend.
func Of(p Provider) Backend { return p.backend() }

// NoLimit is the limit of a reservation that only MaxQueue bounds.
var NoLimit = math.Inf(1)

// Dim is what a store knows of one dimension of a shaper.
type Dim struct {
	// The hot path's fields first, on one cache line: the store's data for
	// the dimension and the GCRA kernels, which Kern and KernAllow point into.
	Bound     any
	Kernels   [2]gcra.Kernel
	Kern      *gcra.Kernel // Alg's GCRA kernel; nil for the other algorithms
	KernAllow *gcra.Kernel // Allow's

	Name     string // "" for a shaper of one contract
	Base     string // the shaper's prefix
	Prefix   string // the dimension's namespace: Base, then Name + ":" when named
	Identity string // algorithm, rate and MaxQueue: shapers sharing a prefix must agree
	Alg      algorithms.Algorithm
	Allow    algorithms.Algorithm // the same transition with no waiting (Allow)
	Clock    timer.Clock          // the shaper's clock, for a decision a store makes on its own
	// AtShare returns Alg and Allow at share of the rate (0 < share <= 1):
	// a FailLocal twin's.
	AtShare func(share float64) (alg, allow algorithms.Algorithm, err error)
}

// Settles reports whether a settle of a reservation of cost at actual (-1:
// cancelled) may change d's state: always for the GCRA family; for the
// other algorithms an extra is charged, and the sliding log also gives
// back (algorithms.GiveBacker); a settle at the cost changes none of them.
func (d *Dim) Settles(cost, actual int64) bool {
	if d.Kern != nil || actual > cost {
		return true
	}
	_, gives := d.Alg.(algorithms.GiveBacker)
	return gives && actual != cost
}

// SetKernels points Kern and KernAllow at d's own copies of the GCRA
// kernels of Alg and Allow (nil for the other algorithms).
func (d *Dim) SetKernels() {
	d.Kern, d.KernAllow = nil, nil
	if k := KernelOf(d.Alg); k != nil {
		d.Kernels[0] = *k
		d.Kern = &d.Kernels[0]
	}
	if k := KernelOf(d.Allow); k != nil {
		d.Kernels[1] = *k
		d.KernAllow = &d.Kernels[1]
	}
}

// KernelOf returns a's GCRA kernel (the leaky bucket and GCRA), or nil for
// the other algorithms.
func KernelOf(a algorithms.Algorithm) *gcra.Kernel {
	g, ok := a.(*algorithms.GCRA)
	if !ok {
		return nil
	}
	_, p := g.Params()
	return gcra.FromParams(p)
}

// Within returns k waiting at most limit ms (a caller's deadline), in
// *buf when that is sooner than its MaxWait, else k itself.
func Within(k *gcra.Kernel, limit float64, buf *gcra.Kernel) *gcra.Kernel {
	if k == nil || limit >= k.MaxWait {
		return k
	}
	*buf = *k
	buf.MaxWait = max(limit, 0)
	return buf
}

// KeySet names the keys one call touches: per dimension, its key. Slot is
// the key that places all of them in one Redis Cluster hash slot (the key
// of the shaper's slot dimension, computed from the caller's key).
type KeySet struct {
	Dims []*Dim
	Keys []string
	Slot string
}

// Request is one multi-dimension transition: the inputs, then the outputs.
type Request struct {
	KeySet
	Algs  []algorithms.Algorithm
	Costs []int64
	Now   float64
	Limit float64 // the longest wait the caller takes, ms (+Inf: MaxQueue alone)
	Any   bool    // Any: the dimensions that admit commit (algorithms.AnyWithin)
	// Floor is how far ahead (ms) slots a failure policy granted locally
	// run on the key, which the store has not seen (0: none): the
	// schedule continues after them (redisstore's FailLocal handoff).
	Floor float64

	Dec     algorithms.AllDecision
	Tags    []float64 // per dimension, the first number of its new state (GCRA: the TAT)
	Gens    []uint32  // per dimension, the reservation's generation (memory, GCRA family)
	Seqs    []float64 // per dimension, its sequence number in the key's Ledger (0: none)
	At      float64   // the departure, ms on the store's timeline
	Decided float64   // the instant the store decided at, ms on its timeline
	Local   bool      // granted by a failure policy, not by the store
	// Anchor is the instant, on the shaper's clock, that Dec.Delay counts
	// from, when a store deciding on another clock (Remote) mapped its slot
	// onto the shaper's (zero: the shaper reads its clock after the call).
	Anchor time.Time
}

// requestBuf is a request of up to four dimensions in one allocation.
type requestBuf struct {
	Request
	d    [4]*Dim
	alg  [4]algorithms.Algorithm
	key  [4]string
	cost [4]int64
	tag  [4]float64
	gen  [4]uint32
	seq  [4]float64
}

// NewRequest returns an empty request for up to n dimensions at now: one
// allocation for n <= 4.
func NewRequest(n int, now float64, slot string) *Request {
	if n > 4 {
		return &Request{Now: now, Limit: NoLimit, KeySet: KeySet{Dims: make([]*Dim, 0, n), Keys: make([]string, 0, n), Slot: slot}, Algs: make([]algorithms.Algorithm, 0, n), Costs: make([]int64, 0, n)}
	}
	b := &requestBuf{}
	b.Request = Request{Now: now, Limit: NoLimit, KeySet: KeySet{Dims: b.d[:0], Keys: b.key[:0], Slot: slot}, Algs: b.alg[:0], Costs: b.cost[:0], Tags: b.tag[:0], Gens: b.gen[:0], Seqs: b.seq[:0]}
	return &b.Request
}

// Inputs returns a copy of req's inputs, which its caller may change once
// it has left.
func (req *Request) Inputs() *Request {
	c := &Request{Now: req.Now, Limit: req.Limit, Any: req.Any, Floor: req.Floor}
	c.KeySet = KeySet{Dims: append([]*Dim(nil), req.Dims...), Keys: append([]string(nil), req.Keys...), Slot: req.Slot}
	c.Algs = append([]algorithms.Algorithm(nil), req.Algs...)
	c.Costs = append([]int64(nil), req.Costs...)
	return c
}

// KeepTook leaves in an admitted Any request only the dimensions that
// committed (Dec.Took), with their outputs, so that a settle or a cancel
// reaches those alone; Binding is renumbered to match.
func (req *Request) KeepTook() {
	n := len(req.Dims)
	if !req.Any || !req.Dec.Allowed || req.Dec.Took == 1<<n-1 {
		return
	}
	j := 0
	for i := range n {
		if req.Dec.Took&(1<<i) == 0 {
			continue
		}
		if req.Dec.Binding == i {
			req.Dec.Binding = j
		}
		req.Dims[j], req.Keys[j], req.Algs[j], req.Costs[j] = req.Dims[i], req.Keys[i], req.Algs[i], req.Costs[i]
		keep(req.Tags, n, i, j)
		keep(req.Gens, n, i, j)
		keep(req.Seqs, n, i, j)
		j++
	}
	req.Dims, req.Keys, req.Algs, req.Costs = req.Dims[:j], req.Keys[:j], req.Algs[:j], req.Costs[:j]
	req.Tags, req.Gens, req.Seqs = cut(req.Tags, n, j), cut(req.Gens, n, j), cut(req.Seqs, n, j)
	req.Dec.Took = 1<<j - 1
}

// keep moves output i to j when s holds one per dimension (n).
func keep[T any](s []T, n, i, j int) {
	if len(s) == n {
		s[j] = s[i]
	}
}

// cut keeps the first j outputs when s holds one per dimension (n).
func cut[T any](s []T, n, j int) []T {
	if len(s) == n {
		return s[:j]
	}
	return s
}

// Settlement is a reservation given back (cancelled before its slot) or
// settled with its actual cost: per dimension that took part, what the
// store returned for it and its cost then and now.
type Settlement struct {
	KeySet
	Tags   []float64
	Gens   []uint32
	Seqs   []float64 // -1: granted under a contract changed since (an extra is charged, nothing given back)
	Costs  []int64
	Actual []int64 // nil: cancelled
	At     float64 // the departure, ms on the store's timeline
	Now    float64 // the shaper's clock, ms
	Local  bool    // granted by a failure policy
	Holes  bool    // a cancel may leave a hole (a shaper of one contract: see gcra.Ledger)
}

// Query is a read of keys' standing for Status: the inputs, then what the
// store read, on its own timeline.
type Query struct {
	KeySet
	Algs  []algorithms.Algorithm
	Costs []int64 // per dimension; 0: the request leaves it out
	Now   float64 // the shaper's clock, ms
	Any   bool    // Any: algorithms.PeekAny names the binding dimension

	At      float64               // the instant the store read at, ms
	Until   float64               // the longest pause's end (At when none)
	Binding int                   // as algorithms.Peek: -1 for the pause
	Figures []algorithms.Standing // per dimension
}

// NameCost names key and d's dimension in a *algorithms.CostError, as every
// store and path names them; any other error is returned as it is.
func NameCost(err error, d *Dim, key string) error {
	var ce *algorithms.CostError
	if errors.As(err, &ce) {
		return &algorithms.CostError{Algorithm: ce.Algorithm, Cost: ce.Cost, Reason: ce.Reason, Key: key, Dimension: d.Name}
	}
	return err
}
