package memstore

import (
	"hash/maphash"
	"slices"
	"sync"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// memShard holds the keys whose hash falls in it, one memSpace per namespace
// (shaper prefix): keys are plain strings, so a lookup hashes the caller's key
// once, with the runtime's string hash, and never builds a composite key.
type memShard struct {
	mu     sync.Mutex
	spaces []*memSpace // by namespace id; created on first use, under mu
	high   float64     // the latest now seen by this shard
	_      [24]byte    // keep shards on separate cache lines
}

// memSpace is one namespace's keys in one shard: their states, in the
// layout of the namespace's algorithm, and their pauses. keys points at
// tats or states, whichever the layout is; the paths that know the layout
// use that one directly (tats is held by value: the hot path follows no
// pointer to reach it).
type memSpace struct {
	keys   keyStates
	tats   tatKeys   // the leaky bucket and GCRA (tats.index != nil): a bare TAT per key
	states stateKeys // the other algorithms: a State per key
	alg    algorithms.Algorithm
	paused map[string]float64    // pauses are rare: nil until the first
	clamps map[string]clampState // partners' clamps (Shaper.Clamp): nil until the first
}

// clampState is a partner's clamp on a key, in ms: while now < end,
// nothing departs before min(next, end), and each departure before end
// moves next to max(next, departure) + interval (lua/lib.lua's
// parse_clamp).
type clampState struct{ next, interval, end float64 }

// floor returns the instant before which key may not depart: its pause's
// end or its clamp's next slot, whichever is later, or now.
func (sp *memSpace) floor(key string, now float64) float64 {
	f := now
	if sp.paused != nil {
		if p, ok := sp.paused[key]; ok && p > f {
			f = p
		}
	}
	if sp.clamps != nil {
		if c, ok := sp.clamps[key]; ok && now < c.end && min(c.next, c.end) > f { // its reset once what it allows is taken
			f = min(c.next, c.end)
		}
	}
	return f
}

// getAt is keys.get, with a TAT stored under another contract than kernel
// k's (changed live) read as k reads it (tatKeys.at); k is nil for the
// algorithms other than the GCRA family.
func (sp *memSpace) getAt(key string, k *gcra.Kernel, now float64) (algorithms.State, bool) {
	t := &sp.tats
	if t.index == nil || k == nil {
		return sp.keys.get(key)
	}
	i, ok := t.index[key]
	if !ok {
		return nil, false
	}
	return algorithms.State{t.at(i, k, now)}, true
}

// clamped reports whether a partner's clamp holds key at now: one request
// departs per slot, so Remaining is at most 1 (as Status reports it).
func (sp *memSpace) clamped(key string, now float64) bool {
	if sp.clamps == nil {
		return false
	}
	c, ok := sp.clamps[key]
	return ok && now < c.end
}

// advance moves key's clamp, if one holds at now, past a departure before
// its reset.
func (sp *memSpace) advance(key string, now, departure float64) {
	if sp.clamps == nil {
		return
	}
	if c, ok := sp.clamps[key]; ok && now < c.end && departure < c.end { // one after the reset is the next window's
		c.next = max(c.next, departure) + c.interval
		sp.clamps[key] = c
	}
}

// sweep evicts the idle entries (states equivalent to a cold key at now and
// not paused, and pauses that have ended) and returns how many it evicted.
func (sp *memSpace) sweep(now float64) int {
	for k, c := range sp.clamps { // not entries under MaxKeys: they end with their reset
		if c.end <= now {
			delete(sp.clamps, k)
		}
	}
	n := 0
	for k, p := range sp.paused {
		if p <= now {
			delete(sp.paused, k)
			n++
		}
	}
	for k := range sp.keys.all() {
		if at, _ := sp.keys.idleAt(k, now); at > now {
			continue
		}
		if _, paused := sp.paused[k]; paused {
			continue
		}
		sp.keys.remove(k)
		n++
	}
	return n
}

// space returns namespace ns's keys in sh, creating them on first use; the
// caller holds sh.mu.
func (m *mem) space(sh *memShard, ns uint32) *memSpace {
	if int(ns) < len(sh.spaces) {
		if sp := sh.spaces[ns]; sp != nil {
			return sp
		}
	}
	algs := *m.algs.Load() // ns was bound before any shaper could use it
	if grow := len(algs) - len(sh.spaces); grow > 0 {
		sh.spaces = append(sh.spaces, make([]*memSpace, grow)...)
	}
	sp := &memSpace{alg: algs[ns]}
	if _, ok := algs[ns].(*algorithms.GCRA); ok {
		sp.tats = tatKeys{index: map[string]uint32{}}
		sp.keys = &sp.tats
	} else {
		sp.states = stateKeys{alg: algs[ns], states: map[string]algorithms.State{}}
		sp.keys = &sp.states
	}
	sh.spaces[ns] = sp
	return sp
}

// memDim is the memory store's data for one bound dimension (store.Dim.Bound):
// the id of its namespace.
type memDim struct{ ns uint32 }

// memNamespace is one prefix's namespace: the configuration of the shapers
// bound to it, and their memDim.
type memNamespace struct {
	identity string
	md       *memDim
}

// nsOf returns the namespace id of d, which this store bound.
func nsOf(d *store.Dim) uint32 { return d.Bound.(*memDim).ns }

// bind gives the dimension a namespace id. Shapers may share a prefix (and so
// their keys' budgets) only with the same algorithm, rate and MaxQueue.
func (m *mem) Bind(d *store.Dim) (any, error) {
	if m.err != nil {
		return nil, m.err
	}
	m.nsMu.Lock()
	defer m.nsMu.Unlock()
	if prev, ok := m.ns[d.Prefix]; ok {
		if prev.identity != d.Identity {
			return nil, &algorithms.ConfigError{Algorithm: "memory-store", Field: "Prefix", Value: d.Prefix,
				Reason: "already used by a shaper with " + prev.identity + "; give each shaper its own WithName or WithPrefix"}
		}
		return prev.md, nil
	}
	algs := slices.Clone(*m.algs.Load())
	md := &memDim{ns: uint32(len(algs))}
	m.algs.Store(new(append(algs, d.Alg)))
	m.ns[d.Prefix] = memNamespace{identity: d.Identity, md: md}
	return md, nil
}

func (m *mem) shardIndex(ns uint32, key string) int {
	h := maphash.String(m.seed, key) ^ uint64(ns)*0x9E3779B97F4A7C15
	return int((h ^ h>>32) & (memShards - 1))
}

func (m *mem) shard(ns uint32, key string) *memShard {
	return &m.shards[m.shardIndex(ns, key)]
}

// enter locks key's shard, records now as seen by it, and returns the shard
// with namespace ns's space in it; the caller unlocks sh.mu.
func (m *mem) enter(ns uint32, key string, now float64) (*memShard, *memSpace) {
	sh := m.shard(ns, key)
	sh.mu.Lock()
	sh.high = max(sh.high, now)
	return sh, m.space(sh, ns)
}
