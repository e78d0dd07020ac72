package memstore

import (
	"iter"
	"maps"
	"strings"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
)

// keyStates holds one namespace's per-key states in one shard, in the
// layout of its algorithm: tatKeys for the leaky bucket and GCRA, stateKeys
// for the others. The caller holds the shard's lock.
type keyStates interface {
	// get returns key's state (a copy for a bare TAT).
	get(key string) (algorithms.State, bool)
	// put stores the state of a reservation for key. It returns the key as
	// the store keeps it when it is new ("" otherwise: isNew reports
	// which), and the reservation's generation (see tatKeys.grant; 0 for
	// layouts without). A new key is cloned, so that the map does not pin
	// the caller's buffer.
	put(key string, st algorithms.State) (stored string, isNew bool, gen uint32)
	// remove deletes key's state and reports whether it held one.
	remove(key string) bool
	// idleAt returns the instant at which key's state becomes equivalent to
	// a cold key, judged at now; ok is false when key holds none.
	idleAt(key string, now float64) (at float64, ok bool)
	// all yields every key that holds a state; the caller may remove the
	// key it was given.
	all() iter.Seq[string]
}

// tatKeys keeps a bare TAT per key in a slab, and the map holds the key's
// index in it: no slice header, no allocation per key, no pointer for the
// collector to follow, and an update is a slab write, not a second map
// operation.
type tatKeys struct {
	index map[string]uint32 // key -> its TAT's index in slab; nil when the namespace keeps States
	slab  []float64         // TATs; the slots in free are unused
	under []uint16          // per slab slot, the contract its TAT was stored under: an index in contracts (0: none recorded; see at)
	// contracts are the interval and tolerance of the contracts the
	// namespace's TATs were stored under, by index (0: none), a handful at
	// most (one per live change): a slot records two bytes, not sixteen.
	contracts [][2]float64
	gens      []uint32                // per slab slot, the generation of its last reservation (see grant), and hasLedger
	led       map[uint32]*gcra.Ledger // the Ledgers of the slots whose gens hold hasLedger (nil until the first)
	free      []uint32                // slab slots of evicted keys, reused first
}

// hasLedger is the bit of a slot's gens word saying that the key has a
// Ledger (see gcra.Ledger), so that the keys without one, most, pay no
// lookup and no byte for it; the other 31 bits are the generation.
const hasLedger = 1 << 31

// ledger returns slot i's Ledger, or nil.
func (t *tatKeys) ledger(i uint32) *gcra.Ledger {
	if t.gens[i]&hasLedger == 0 {
		return nil
	}
	return t.led[i]
}

// setLedger gives slot i the Ledger l (nil: none).
func (t *tatKeys) setLedger(i uint32, l *gcra.Ledger) {
	if l == nil {
		if t.gens[i]&hasLedger != 0 {
			delete(t.led, i)
			t.gens[i] &^= hasLedger
		}
		return
	}
	if t.led == nil {
		t.led = map[uint32]*gcra.Ledger{}
	}
	t.led[i] = l
	t.gens[i] |= hasLedger
}

// add stores a new key's TAT, stored under kernel k (nil: read as it is by
// every kernel), and returns its slab slot; key must already be a clone.
func (t *tatKeys) add(key string, tat float64, k *gcra.Kernel) uint32 {
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
		t.slab[i] = tat
	} else {
		i = uint32(len(t.slab))
		t.slab = append(t.slab, tat)
		t.under = append(t.under, 0)
		t.gens = append(t.gens, 0)
	}
	t.under[i] = t.contract(k)
	t.index[key] = i
	return i
}

// contract returns the index of kernel k's contract in t.contracts,
// adding it (0 for nil: none recorded). Past 65,535 contracts in one
// namespace the oldest index is reused: a TAT stored under it is read as
// the later contract, which a key idle since then (every one, in
// practice) does not notice.
func (t *tatKeys) contract(k *gcra.Kernel) uint16 {
	if k == nil {
		return 0
	}
	if len(t.contracts) == 0 {
		t.contracts = append(t.contracts, [2]float64{}) // index 0: none
	}
	c := [2]float64{k.Interval, k.Tau}
	for j := len(t.contracts) - 1; j > 0; j-- { // the latest first: the one in force
		if t.contracts[j] == c {
			return uint16(j)
		}
	}
	if len(t.contracts) <= 0xFFFF {
		t.contracts = append(t.contracts, c)
		return uint16(len(t.contracts) - 1)
	}
	t.contracts[1] = c
	return 1
}

// at returns slot i's TAT as kernel k reads it at now: one stored under
// another contract (changed live) is converted (gcra.Kernel.Convert).
func (t *tatKeys) at(i uint32, k *gcra.Kernel, now float64) float64 {
	if u := t.under[i]; u != 0 {
		if c := t.contracts[u]; c[0] != k.Interval || c[1] != k.Tau {
			return k.Convert(t.slab[i], now, c[0], c[1])
		}
	}
	return t.slab[i]
}

// set stores slot i's TAT, stored under kernel k.
func (t *tatKeys) set(i uint32, tat float64, k *gcra.Kernel) {
	t.slab[i] = tat
	t.under[i] = t.contract(k)
}

// grant gives a reservation on slab slot i its generation: a number no
// other reservation on the key has had lately (it wraps after 2^32), so that
// a Cancel refunds its own slot only, and once. Comparing TATs alone is not
// enough: after a refund the next reservation stores the very TAT the
// cancelled one had.
func (t *tatKeys) grant(i uint32) uint32 {
	g := t.gens[i]
	t.gens[i] = g&hasLedger | (g+1)&^hasLedger
	return t.gens[i] &^ hasLedger
}

// drop removes the key whose slab slot is i.
func (t *tatKeys) drop(key string, i uint32) {
	delete(t.index, key)
	t.setLedger(i, nil)
	t.free = append(t.free, i)
}

func (t *tatKeys) get(key string) (algorithms.State, bool) {
	i, ok := t.index[key]
	if !ok {
		return nil, false
	}
	return algorithms.State{t.slab[i]}, true
}

func (t *tatKeys) put(key string, st algorithms.State) (string, bool, uint32) {
	if i, ok := t.index[key]; ok {
		t.slab[i] = st[0]
		return "", false, t.grant(i)
	}
	stored := strings.Clone(key)
	return stored, true, t.grant(t.add(stored, st[0], nil))
}

func (t *tatKeys) remove(key string) bool {
	i, ok := t.index[key]
	if ok {
		t.drop(key, i)
	}
	return ok
}

// idleAt is the TAT itself (the key is cold once it has passed), or its
// Ledger's horizon if that is later.
func (t *tatKeys) idleAt(key string, _ float64) (float64, bool) {
	i, ok := t.index[key]
	if !ok {
		return 0, false
	}
	at := t.slab[i]
	if l := t.ledger(i); l != nil {
		at = max(at, l.Horizon())
	}
	return at, true
}

func (t *tatKeys) all() iter.Seq[string] { return maps.Keys(t.index) }

// stateKeys keeps a State per key, for the algorithms other than the GCRA
// family.
type stateKeys struct {
	alg    algorithms.Algorithm
	states map[string]algorithms.State
}

func (s *stateKeys) get(key string) (algorithms.State, bool) {
	st, ok := s.states[key]
	return st, ok
}

func (s *stateKeys) put(key string, st algorithms.State) (string, bool, uint32) {
	if _, ok := s.states[key]; ok {
		s.states[key] = st
		return "", false, 0
	}
	stored := strings.Clone(key)
	s.states[stored] = st
	return stored, true, 0
}

func (s *stateKeys) remove(key string) bool {
	_, ok := s.states[key]
	if ok {
		delete(s.states, key)
	}
	return ok
}

func (s *stateKeys) idleAt(key string, now float64) (float64, bool) {
	st, ok := s.states[key]
	if !ok {
		return 0, false
	}
	_, reset := s.alg.Status(st, now)
	return now + reset, true
}

func (s *stateKeys) all() iter.Seq[string] { return maps.Keys(s.states) }
