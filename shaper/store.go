package shaper

import (
	"context"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
)

// Store keeps shapers' per-key state: NewMemoryStore for one process,
// NewRedisStore for a fleet. One store serves many shapers, each under its
// own prefix. Its methods are unexported: this package's stores are its only
// implementations.
type Store interface {
	// bind registers one dimension of a shaper with the store and returns
	// the store's own data for it, which the shaper keeps in d.bound and
	// hands back with d on every call, never reading it.
	bind(d *dim) (any, error)
	// reserveAll runs one transition over one key per dimension, all or
	// nothing. (A shaper of one contract on a MemoryStore calls its reserve
	// instead: see Shaper.reserveOne.)
	reserveAll(ctx context.Context, req *multi) error
	// settle gives back what a reservation of the GCRA family did not use
	// (see settlement): as much as its key's schedule allows, never more.
	settle(ctx context.Context, st *settlement) error
	// pause holds every departure on the keys for d ms from now (ms; a store
	// on the server's clock measures from its own now).
	pause(ctx context.Context, ks keyset, now, d float64) error
	// clamp sets a partner's clamp on the keys (Shaper.Clamp): until now +
	// span (ms), departures at least interval ms apart.
	clamp(ctx context.Context, ks keyset, now, interval, span float64) error
	// status reads the keys' standing without changing anything (see
	// query).
	status(ctx context.Context, q *query) error
	// rebind registers d again, a dimension of a contract changed live
	// (d.bound is the store's data for it under the contract before), and
	// returns the store's data for it now.
	rebind(d *dim) (any, error)
	// readContract returns the live contract recorded for the shapers under
	// prefix (the zero record when none).
	readContract(ctx context.Context, prefix string) (record, error)
	// writeContract records one change of that contract, made by a shaper
	// whose configured contract is identity (record.merge), and returns the
	// record after it.
	writeContract(ctx context.Context, prefix, identity, field, value string) (record, error)
	// reset forgets the keys.
	reset(ctx context.Context, ks keyset) error
	// pauseLeft returns how many ms remain of the longest pause on the keys
	// (0 when none), now being the shaper's clock in ms.
	pauseLeft(ctx context.Context, ks keyset, now float64) (float64, error)
}

// keyset names the keys one call touches: per dimension, its key. slot is
// the key that places all of them in one Redis Cluster hash slot: the key of
// the shaper's slot dimension (see Dimension.Slot), computed from the
// caller's key, so that it does not depend on the order of the dimensions
// or on which of them a request leaves out.
type keyset struct {
	dims []*dim
	keys []string
	slot string
}

// multi is one multi-dimension transition: the inputs, then the outputs.
// multiBuf is a request of up to four dimensions in one allocation: the
// multi and the arrays its slices view.
type multiBuf struct {
	multi
	d    [4]*dim
	alg  [4]algorithms.Algorithm
	key  [4]string
	cost [4]int64
	tag  [4]float64
	gen  [4]uint32
	seq  [4]float64
}

// newMulti returns an empty request for up to n dimensions at now: one
// allocation for n <= 4.
func newMulti(n int, now float64, slot string) *multi {
	if n > 4 {
		return &multi{now: now, limit: noLimit, keyset: keyset{dims: make([]*dim, 0, n), keys: make([]string, 0, n), slot: slot}, algs: make([]algorithms.Algorithm, 0, n), costs: make([]int64, 0, n)}
	}
	b := &multiBuf{}
	b.multi = multi{now: now, limit: noLimit, keyset: keyset{dims: b.d[:0], keys: b.key[:0], slot: slot}, algs: b.alg[:0], costs: b.cost[:0], tags: b.tag[:0], gens: b.gen[:0], seqs: b.seq[:0]}
	return &b.multi
}

type multi struct {
	keyset // the dimensions taking part, their keys and the slot
	algs   []algorithms.Algorithm
	costs  []int64
	now    float64

	dec   algorithms.AllDecision
	tags  []float64 // per dimension, the first number of its new state (GCRA: the TAT)
	gens  []uint32  // per dimension, the reservation's generation (memory store, GCRA family)
	seqs  []float64 // per dimension, its sequence number in the key's Ledger (0: none; see gcra.Ledger)
	at    float64   // the departure, in ms on the store's timeline
	limit float64   // the longest wait the caller takes, in ms (its deadline; +Inf: MaxQueue alone)
	local bool      // granted by the failure policy, not by the store (see RedisStore)
	any   bool      // Any: the dimensions that admit commit (dec.Took), algorithms.AnyWithin
}

// keepTook leaves in an admitted Any request only the dimensions that
// committed (dec.Took), with their outputs, so that a settle or a cancel
// reaches those alone; Binding is renumbered to match.
func (m *multi) keepTook() {
	n := len(m.dims)
	if !m.any || !m.dec.Allowed || m.dec.Took == 1<<n-1 {
		return
	}
	j := 0
	for i := range n {
		if m.dec.Took&(1<<i) == 0 {
			continue
		}
		if m.dec.Binding == i {
			m.dec.Binding = j
		}
		m.dims[j], m.keys[j], m.algs[j], m.costs[j] = m.dims[i], m.keys[i], m.algs[i], m.costs[i]
		if len(m.tags) == n {
			m.tags[j] = m.tags[i]
		}
		if len(m.gens) == n {
			m.gens[j] = m.gens[i]
		}
		if len(m.seqs) == n {
			m.seqs[j] = m.seqs[i]
		}
		j++
	}
	m.dims, m.keys, m.algs, m.costs = m.dims[:j], m.keys[:j], m.algs[:j], m.costs[:j]
	if len(m.tags) == n {
		m.tags = m.tags[:j]
	}
	if len(m.gens) == n {
		m.gens = m.gens[:j]
	}
	if len(m.seqs) == n {
		m.seqs = m.seqs[:j]
	}
	m.dec.Took = 1<<j - 1
}

// kernelOf returns a's GCRA kernel (the leaky bucket and GCRA), or nil for
// the other algorithms.
func kernelOf(a algorithms.Algorithm) *gcra.Kernel {
	g, ok := a.(*algorithms.GCRA)
	if !ok {
		return nil
	}
	_, p := g.Params()
	return gcra.FromParams(p)
}

// settlement is a reservation given back (cancelled before its slot) or
// settled with its actual cost: per dimension that took part, what the
// store returned for it (its tag, generation and sequence number) and its
// cost then and now.
type settlement struct {
	keyset
	tags   []float64
	gens   []uint32
	seqs   []float64
	costs  []int64
	actual []int64 // nil: cancelled
	at     float64 // the departure, in ms on the store's timeline
	now    float64 // the shaper's clock, in ms
	local  bool    // granted by a failure policy (see RedisStore)
	holes  bool    // a cancel may leave a hole (a shaper of one contract: see gcra.Ledger)
}

// query is a read of keys' standing for Status: the inputs, then what the
// store read, on its own timeline (a RedisStore on Redis TIME).
type query struct {
	keyset
	algs  []algorithms.Algorithm
	costs []int64 // per dimension; 0: the request leaves it out
	now   float64 // the shaper's clock, ms
	any   bool    // Any: algorithms.PeekAny names the binding dimension

	at      float64               // the instant the store read at, ms
	until   float64               // the longest pause's end (at when none)
	binding int                   // as algorithms.Peek: -1 for the pause
	figures []algorithms.Standing // per dimension
}
