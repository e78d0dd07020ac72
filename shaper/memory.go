package shaper

import (
	"cmp"
	"context"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
)

const memShards = 64 // a power of two

// DefaultSweepInterval is how often a memory store evicts idle keys by default.
const DefaultSweepInterval = time.Minute

// MemoryStore keeps shaper state in this process. It is sharded, with no
// global lock on the hot path and no allocation per reservation on an
// existing key. Keys idle long enough to be equivalent to a cold key are
// evicted by a background sweeper; WithMaxKeys caps the entries held, never
// evicting a key that is still throttled or paused. Shapers sharing a store
// should share a clock: idleness is judged at the latest instant any passed.
type MemoryStore struct {
	seed     maphash.Seed
	shards   [memShards]memShard
	keys     atomic.Int64
	maxKeys  int64
	interval time.Duration
	err      error

	capMu sync.Mutex // guards capH (see memory_cap.go)
	capH  capHeap

	recMu   sync.Mutex
	records map[string]*memRecord // prefix -> its live contract (see Shaper.SetRate)

	nsMu sync.Mutex
	ns   map[string]memNamespace                // prefix -> its namespace
	algs atomic.Pointer[[]algorithms.Algorithm] // namespace id -> algorithm, copy on write

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

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

// MemoryOption configures NewMemoryStore.
type MemoryOption func(*MemoryStore)

// WithMaxKeys caps the entries held (a key's state and a key's pause each
// count; 0, the default, means no cap). At the cap a new entry evicts an idle
// one, or fails with ErrStoreFull if none is idle.
func WithMaxKeys(n int) MemoryOption {
	return func(m *MemoryStore) {
		if n < 0 {
			m.err = &ConfigError{Algorithm: "memory-store", Field: "MaxKeys", Value: n, Reason: "must be >= 0"}
		}
		m.maxKeys = int64(n)
	}
}

// WithSweepInterval sets how often idle keys are evicted in the background
// (default DefaultSweepInterval; 0 disables the sweeper).
func WithSweepInterval(d time.Duration) MemoryOption {
	return func(m *MemoryStore) {
		if d < 0 {
			m.err = &ConfigError{Algorithm: "memory-store", Field: "SweepInterval", Value: d, Reason: "must be >= 0"}
		}
		m.interval = d
	}
}

// NewMemoryStore returns an in-memory store. An invalid option is reported
// when a shaper is bound to the store (New or All).
func NewMemoryStore(opts ...MemoryOption) *MemoryStore {
	m := &MemoryStore{seed: maphash.MakeSeed(), interval: DefaultSweepInterval, ns: map[string]memNamespace{}}
	for _, o := range opts {
		o(m)
	}
	m.algs.Store(&[]algorithms.Algorithm{})
	if m.err == nil && m.interval > 0 {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.sweeper()
	}
	return m
}

// Close stops the background sweeper and waits for it; the store stays usable.
func (m *MemoryStore) Close() error {
	m.closeOnce.Do(func() {
		if m.stop != nil {
			close(m.stop)
			<-m.done
		}
	})
	return nil
}

// Len returns the number of entries held, as WithMaxKeys counts them.
func (m *MemoryStore) Len() int { return int(m.keys.Load()) }

func (m *MemoryStore) sweeper() {
	defer close(m.done)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep()
		}
	}
}

// Sweep evicts every idle key now and returns how many it evicted.
func (m *MemoryStore) Sweep() int {
	now := 0.0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		now = max(now, sh.high)
		sh.mu.Unlock()
	}
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += m.sweepShard(sh, now)
		sh.mu.Unlock()
	}
	return n
}

// sweepShard evicts the idle keys of sh; the caller holds sh.mu.
func (m *MemoryStore) sweepShard(sh *memShard, now float64) int {
	n := 0
	for _, sp := range sh.spaces {
		if sp != nil {
			n += sp.sweep(now)
		}
	}
	m.keys.Add(int64(-n))
	return n
}

// space returns namespace ns's keys in sh, creating them on first use; the
// caller holds sh.mu.
func (m *MemoryStore) space(sh *memShard, ns uint32) *memSpace {
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

// memDim is the memory store's data for one bound dimension (dim.bound):
// the id of its namespace.
type memDim struct{ ns uint32 }

// memNamespace is one prefix's namespace: the configuration of the shapers
// bound to it, and their memDim.
type memNamespace struct {
	identity string
	md       *memDim
}

// nsOf returns the namespace id of d, which this store bound.
func nsOf(d *dim) uint32 { return d.bound.(*memDim).ns }

// bind gives the dimension a namespace id. Shapers may share a prefix (and so
// their keys' budgets) only with the same algorithm, rate and MaxQueue.
func (m *MemoryStore) bind(d *dim) (any, error) {
	if m.err != nil {
		return nil, m.err
	}
	m.nsMu.Lock()
	defer m.nsMu.Unlock()
	if prev, ok := m.ns[d.prefix]; ok {
		if prev.identity != d.identity {
			return nil, &ConfigError{Algorithm: "memory-store", Field: "Prefix", Value: d.prefix,
				Reason: "already used by a shaper with " + prev.identity + "; give each shaper its own WithName or WithPrefix"}
		}
		return prev.md, nil
	}
	algs := slices.Clone(*m.algs.Load())
	md := &memDim{ns: uint32(len(algs))}
	m.algs.Store(new(append(algs, d.alg)))
	m.ns[d.prefix] = memNamespace{identity: d.identity, md: md}
	return md, nil
}

func (m *MemoryStore) shardIndex(ns uint32, key string) int {
	h := maphash.String(m.seed, key) ^ uint64(ns)*0x9E3779B97F4A7C15
	return int((h ^ h>>32) & (memShards - 1))
}

func (m *MemoryStore) shard(ns uint32, key string) *memShard {
	return &m.shards[m.shardIndex(ns, key)]
}

// enter locks key's shard, records now as seen by it, and returns the shard
// with namespace ns's space in it; the caller unlocks sh.mu.
func (m *MemoryStore) enter(ns uint32, key string, now float64) (*memShard, *memSpace) {
	sh := m.shard(ns, key)
	sh.mu.Lock()
	sh.high = max(sh.high, now)
	return sh, m.space(sh, ns)
}

// reserve runs one transition on one key of a shaper of one contract, for
// an admissible cost, writing the decision to *dec (the caller's zero
// Decision): a concrete call, so that dec stays on the caller's stack. The
// leaky bucket and GCRA go to reserveTAT instead. It returns the
// reservation's tag.
func (m *MemoryStore) reserve(d *dim, alg algorithms.Algorithm, key string, cost int64, now float64, dec *algorithms.Decision) (float64, uint32, error) {
	sh, sp := m.enter(nsOf(d), key, now)
	defer sh.mu.Unlock()
	st, exists := sp.states.states[key]
	next, res, err := algorithms.ReserveNotBefore(alg, st, now, sp.floor(key, now), cost)
	if err != nil || !res.Allowed {
		*dec = res
		return 0, 0, err
	}
	switch {
	case !exists:
		if !m.claim(sh, now) {
			return 0, 0, ErrStoreFull
		}
		k := strings.Clone(key)
		sp.states.states[k] = next
		m.trackState(sp, nsOf(d), k, next, now)
	case len(next) != len(st) || &next[0] != &st[0]:
		sp.states.states[key] = next
	}
	sp.advance(key, now, now) // an algorithm that does not queue admits only what departs now
	if res.Remaining > 1 && sp.clamped(key, now) {
		res.Remaining = 1
	}
	*dec = res
	return next[0], 0, nil
}

// reserveTAT is reserve for the GCRA family (k is the kernel of d's leaky
// bucket or of its Allow form), whose keys hold a bare TAT: the kernel's
// transition, one lookup and one store, and the decision written once, to
// *dec (the zero Decision). It returns the reservation's tag (the stored
// TAT), its generation (see tatKeys.grant), and, on a key with a Ledger, its
// sequence number (0 without) and its departure in ms (see ledgered).
func (m *MemoryStore) reserveTAT(d *dim, k *gcra.Kernel, key string, cost int64, now float64, dec *algorithms.Decision) (tag float64, gen uint32, seq, at float64, err error) {
	sh, sp := m.enter(nsOf(d), key, now)
	defer sh.mu.Unlock()
	t := &sp.tats
	i, exists := t.index[key]
	tat := gcra.Cold
	if exists {
		tat = t.at(i, k, now)
		if t.gens[i]&hasLedger != 0 {
			return m.ledgered(sp, i, k, key, cost, now, dec)
		}
	}
	next, wait, allowed := k.Reserve(tat, now, sp.floor(key, now), cost)
	if !allowed { // *dec is the caller's zero Decision: set what differs
		dec.RetryAfter = algorithms.Duration(wait)
		return 0, 0, 0, 0, nil
	}
	dec.Allowed, dec.Delay, dec.Remaining = true, algorithms.Duration(wait), k.Remaining(next, now)
	if exists {
		t.set(i, next, k)
	} else {
		if !m.claim(sh, now) {
			*dec = algorithms.Decision{}
			return 0, 0, 0, 0, ErrStoreFull
		}
		kc := strings.Clone(key) // do not pin the caller's buffer
		i = t.add(kc, next, k)
		m.track(nsOf(d), kc, next, false)
	}
	if sp.clamps != nil {
		sp.advance(key, now, now+wait)
		if dec.Remaining > 1 && sp.clamped(key, now) {
			dec.Remaining = 1
		}
	}
	return next, t.grant(i), 0, now + wait, nil
}

// ledgered is reserveTAT on a key with a Ledger: the earliest hole a
// cancelled reservation left that the request fits in and that comes before
// its slot, or else the slot, recorded in the Ledger. A key that once gave
// back keeps a Ledger while it is held (a Ledger made on a busy key cannot
// refund the reservations departing before its older departures): on a
// cold key it starts afresh.
func (m *MemoryStore) ledgered(sp *memSpace, i uint32, k *gcra.Kernel, key string, cost int64, now float64, dec *algorithms.Decision) (tag float64, gen uint32, seq, at float64, err error) {
	t := &sp.tats
	tat, l := t.at(i, k, now), t.ledger(i)
	floor := sp.floor(key, now)
	next, wait, allowed := k.Reserve(tat, now, floor, cost)
	before := math.Inf(1)
	if allowed {
		before = now + wait
	}
	fits := l.Fits(k) // a Ledger made under another contract (changed live) is not used
	if fits {
		if at, seq, ok := l.Take(k, now, floor, before, cost); ok {
			dec.Allowed, dec.Delay, dec.Remaining = true, algorithms.Duration(at-now), k.Remaining(tat, now)
			sp.advance(key, now, at)
			if dec.Remaining > 1 && sp.clamped(key, now) {
				dec.Remaining = 1
			}
			return tat, t.gens[i] &^ hasLedger, seq, at, nil
		}
	}
	if !allowed {
		dec.RetryAfter = algorithms.Duration(wait)
		return 0, 0, 0, 0, nil
	}
	dec.Allowed, dec.Delay, dec.Remaining = true, algorithms.Duration(wait), k.Remaining(next, now)
	t.set(i, next, k)
	sp.advance(key, now, now+wait)
	if dec.Remaining > 1 && sp.clamped(key, now) {
		dec.Remaining = 1
	}
	switch {
	case l.Idle(tat, now): // cold, no hole ahead: a fresh Ledger, whose steps know every departure
		l = k.NewLedger(tat, now)
		t.setLedger(i, l)
	case !fits: // busy under another contract: the key goes on without one
		t.setLedger(i, nil)
		return next, t.grant(i), 0, now + wait, nil
	}
	return next, t.grant(i), l.Grant(k, now+wait, cost), now + wait, nil
}

// seedTAT raises key's TAT in d's space to at least tat (the GCRA family
// only): the RedisStore keeps its FailLocal twin's schedule level with
// Redis's. A new key that does not fit under MaxKeys is not seeded.
func (m *MemoryStore) seedTAT(d *dim, key string, tat, now float64) {
	sh, sp := m.enter(nsOf(d), key, now)
	defer sh.mu.Unlock()
	t := &sp.tats
	if t.index == nil {
		return
	}
	if i, ok := t.index[key]; ok {
		if tat > t.at(i, d.kern, now) {
			t.set(i, tat, d.kern)
		}
		return
	}
	if m.claim(sh, now) {
		k := strings.Clone(key)
		_ = t.add(k, tat, d.kern)
		m.track(nsOf(d), k, tat, false)
	}
}

// lockAll locks the shards of keys in index order (so that concurrent
// multi-key transitions cannot deadlock). It returns each key's shard, and
// the distinct shards it locked, for unlockAll.
// perKey and locked are appended to (pass the caller's buffers, so that a
// request of a few dimensions allocates nothing here).
func (m *MemoryStore) lockAll(dims []*dim, keys []string, perKey, locked []*memShard) ([]*memShard, []*memShard) {
	var buf [4]int
	idx := buf[:0]
	for i := range keys {
		j := m.shardIndex(nsOf(dims[i]), keys[i])
		idx = append(idx, j)
		perKey = append(perKey, &m.shards[j])
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, j := range idx {
		sh := &m.shards[j]
		sh.mu.Lock()
		locked = append(locked, sh)
	}
	return perKey, locked
}

func unlockAll(shards []*memShard) {
	for _, sh := range shards {
		sh.mu.Unlock()
	}
}

func (m *MemoryStore) reserveAll(_ context.Context, req *multi) error {
	var shardBuf, lockedBuf, spaceBuf = [4]*memShard{}, [4]*memShard{}, [4]*memSpace{}
	var dimBuf [4]algorithms.Dim
	shards, locked := m.lockAll(req.dims, req.keys, shardBuf[:0], lockedBuf[:0])
	defer unlockAll(locked)
	n := len(req.dims)
	dims, spaces := dimBuf[:0], spaceBuf[:0]
	for range n {
		dims, spaces = append(dims, algorithms.Dim{}), append(spaces, nil)
	}
	floor, fresh := req.now, 0
	for i, d := range req.dims {
		sh := shards[i]
		sp := m.space(sh, nsOf(d))
		spaces[i] = sp
		sh.high = max(sh.high, req.now)
		floor = max(floor, sp.floor(req.keys[i], req.now))
		st, exists := sp.getAt(req.keys[i], d.kern, req.now)
		if !exists {
			fresh++
		}
		dims[i] = algorithms.Dim{Alg: req.algs[i], State: st, Cost: req.costs[i]}
	}
	// Places under the cap are claimed before the transition, which may
	// write existing keys' states in place. No shard is passed as held: an
	// eviction may not touch the shards locked here, so it can never take
	// one of this request's own keys.
	for c := range fresh {
		if !m.claim(nil, req.now) {
			for range c {
				m.unclaim()
			}
			return ErrStoreFull
		}
	}
	var dec algorithms.AllDecision
	var err error
	if req.any {
		dec, err = algorithms.AnyWithin(dims, req.now, floor, req.limit)
	} else {
		dec, err = algorithms.AllWithin(dims, req.now, floor, req.limit)
	}
	req.dec = dec
	if err != nil || !dec.Allowed {
		for range fresh {
			m.unclaim()
		}
		if err != nil && dec.Binding >= 0 && dec.Binding < n {
			return nameCost(err, req.dims[dec.Binding], req.keys[dec.Binding])
		}
		return err
	}
	req.tags, req.gens, req.seqs = req.tags[:0], req.gens[:0], req.seqs[:0] // newMulti's arrays: no allocation up to four dimensions
	req.at = req.now + dec.Wait
	for i, d := range req.dims {
		if dec.Took&(1<<i) == 0 { // Any: a dimension that did not admit is untouched
			if _, exists := spaces[i].keys.get(req.keys[i]); !exists {
				m.unclaim()
			}
			req.tags, req.gens, req.seqs = append(req.tags, 0), append(req.gens, 0), append(req.seqs, 0)
			continue
		}
		spaces[i].advance(req.keys[i], req.now, req.at)
		if req.dec.Remaining > 1 && spaces[i].clamped(req.keys[i], req.now) { // one request a slot (see clamped)
			req.dec.Remaining = 1
		}
		stored, isNew, gen := spaces[i].keys.put(req.keys[i], dims[i].State)
		if isNew {
			m.trackState(spaces[i], nsOf(d), stored, dims[i].State, req.now)
		}
		if t := &spaces[i].tats; t.index != nil && d.kern != nil { // stored under d's contract
			t.under[t.index[req.keys[i]]] = t.contract(d.kern)
		}
		seq := 0.0
		if t := &spaces[i].tats; t.index != nil && !isNew { // a key of the GCRA family with a Ledger records its departure
			j := t.index[req.keys[i]]
			if l := t.ledger(j); l != nil && l.Fits(d.kern) {
				seq = l.Grant(d.kern, req.at, req.costs[i])
			} else if l != nil { // made under another contract (changed live): dropped
				t.setLedger(j, nil)
			}
		}
		req.tags, req.gens, req.seqs = append(req.tags, dims[i].State[0]), append(req.gens, gen), append(req.seqs, seq)
	}
	return nil
}

// trackState records a state just added under key (the store's own copy)
// at the instant it becomes idle (see track); without a cap it does nothing.
func (m *MemoryStore) trackState(sp *memSpace, ns uint32, key string, st algorithms.State, now float64) {
	if m.maxKeys == 0 {
		return
	}
	_, reset := sp.alg.Status(st, now)
	m.track(ns, key, now+reset, false)
}

// each runs f on every (dimension, key) pair with the key's shard locked.
func (m *MemoryStore) each(ks keyset, f func(sh *memShard, sp *memSpace, d *dim, i int)) {
	for i, d := range ks.dims {
		sh := m.shard(nsOf(d), ks.keys[i])
		sh.mu.Lock()
		f(sh, m.space(sh, nsOf(d)), d, i)
		sh.mu.Unlock()
	}
}

// settle gives back, per key of the GCRA family, what the reservation did
// not use. A key without a Ledger refunds only the tail of its schedule
// (its TAT and generation both match the reservation's; the generation is
// bumped, so that a copy of the reservation refunds nothing) and gets a
// Ledger; a key with one follows its rule (gcra.Ledger).
func (m *MemoryStore) settle(_ context.Context, st *settlement) error {
	keys := st.keys
	var err error
	m.each(st.keyset, func(sh *memShard, sp *memSpace, d *dim, i int) {
		t := &sp.tats
		extra := st.actual != nil && st.actual[i] > st.costs[i]
		if d.kern == nil || t.index == nil { // the other algorithms: an extra is charged now, nothing given back
			if !extra {
				return
			}
			if cur, ok := sp.states.states[keys[i]]; ok {
				sp.states.states[keys[i]] = d.alg.Commit(cur, st.now, 0, st.actual[i]-st.costs[i])
			} else if m.claim(sh, st.now) { // evicted, cold: the extra is charged on a cold state
				k := strings.Clone(keys[i])
				next := d.alg.Commit(nil, st.now, 0, st.actual[i]-st.costs[i])
				sp.states.states[k] = next
				m.trackState(sp, nsOf(d), k, next, st.now)
			} else {
				err = ErrStoreFull
			}
			return
		}
		j, ok := t.index[keys[i]]
		if !ok { // evicted: cold, nothing to give back; an extra is still charged
			if extra {
				err = cmp.Or(err, m.chargeCold(sh, sp, d, keys[i], st, i))
			}
			return
		}
		before := t.slab[j]
		l := t.ledger(j)
		gen := t.gens[j] &^ hasLedger
		cur := t.at(j, d.kern, st.now) // as the reservation's contract reads it
		s, l := settleTAT(d.kern, cur, l, &gen, st, i)
		if s != cur { // unchanged, it stays as stored (under the contract that stored it), as on Redis
			t.set(j, s, d.kern)
		}
		t.gens[j] = t.gens[j]&hasLedger | gen
		t.setLedger(j, l)
		if t.slab[j] < before {
			m.track(nsOf(d), strings.Clone(keys[i]), t.slab[j], false) // idle earlier than recorded
		}
	})
	return err
}

// chargeCold charges the extra of a settle on a key of the GCRA family that
// was evicted: every departure it held was at or before the key went cold,
// so at most now, and the extra raises their terms: the key's TAT becomes
// now + T*(actual - cost) (gcra.Kernel.ChargeCold). A Ledger records the
// reservation as settled, so that a copy of it charges nothing. The caller
// holds the key's shard.
func (m *MemoryStore) chargeCold(sh *memShard, sp *memSpace, d *dim, key string, st *settlement, i int) error {
	if !m.claim(sh, st.now) {
		return ErrStoreFull
	}
	t := &sp.tats
	s := d.kern.ChargeCold(st.now, st.costs[i], st.actual[i])
	k := strings.Clone(key)
	j := t.add(k, s, d.kern)
	m.track(nsOf(d), k, s, false)
	l := d.kern.NewLedger(s, st.now)
	if st.seqs[i] == 0 {
		l.Claim(st.tags[i])
	}
	t.setLedger(j, l)
	return nil
}

// settleTAT is the rule of settle for one key whose TAT is s, Ledger l
// (nil: none yet) and generation *gen (the local twins of a RedisStore
// follow it too). It returns the TAT to store and the key's Ledger.
func settleTAT(k *gcra.Kernel, s float64, l *gcra.Ledger, gen *uint32, st *settlement, i int) (float64, *gcra.Ledger) {
	actual := int64(0)
	if st.actual != nil {
		actual = st.actual[i]
	}
	if l != nil && !l.Fits(k) || st.seqs[i] < 0 { // another contract's Ledger, or a slot granted under another contract: an extra is charged, nothing given back
		return k.Charge(s, st.costs[i], actual), l
	}
	if l == nil {
		if st.seqs[i] == 0 && *gen == st.gens[i] && s == st.tags[i] {
			// The tail: all of it comes back, and a Ledger begins.
			s = k.SettleTail(s, st.at, st.costs[i], actual)
			*gen = (*gen + 1) &^ hasLedger
			l = k.NewLedger(s, st.now)
			l.Claim(st.tags[i])
			return s, l
		}
		l = k.NewLedger(s, st.now)
	}
	if st.actual == nil && st.holes {
		return l.Cancel(k, s, st.at, st.costs[i], st.seqs[i], st.tags[i], st.now), l
	}
	return l.Settle(k, s, st.at, st.costs[i], actual, st.seqs[i], st.tags[i], st.now), l
}

// pause records a pause per key; a new pause record is an entry under
// MaxKeys like a state. At the cap with nothing idle to evict it fails with
// ErrStoreFull (the dimensions before it stay paused: a pause only holds
// departures back).
func (m *MemoryStore) pause(_ context.Context, ks keyset, now, d float64) error {
	until, keys := now+d, ks.keys
	var err error
	m.each(ks, func(sh *memShard, sp *memSpace, dm *dim, i int) {
		if err != nil {
			return
		}
		if p, ok := sp.paused[keys[i]]; ok {
			if until > p {
				sp.paused[keys[i]] = until
			}
			return
		}
		if !m.claim(sh, now) {
			err = ErrStoreFull
			return
		}
		if sp.paused == nil {
			sp.paused = map[string]float64{}
		}
		k := strings.Clone(keys[i])
		sp.paused[k] = until
		m.track(nsOf(dm), k, until, true)
	})
	return err
}

func (m *MemoryStore) reset(_ context.Context, ks keyset) error {
	keys := ks.keys
	m.each(ks, func(_ *memShard, sp *memSpace, _ *dim, i int) {
		if sp.keys.remove(keys[i]) {
			m.keys.Add(-1)
		}
		if _, ok := sp.paused[keys[i]]; ok {
			delete(sp.paused, keys[i])
			m.keys.Add(-1)
		}
		delete(sp.clamps, keys[i])
	})
	return nil
}

// clamp sets a partner's clamp on every key (see Shaper.Clamp): it keeps
// the next slot of a clamp still in force, if that falls within its window.
func (m *MemoryStore) clamp(_ context.Context, ks keyset, now, interval, span float64) error {
	keys := ks.keys
	m.each(ks, func(_ *memShard, sp *memSpace, _ *dim, i int) {
		next := now
		if c, ok := sp.clamps[keys[i]]; ok && now < c.end && c.next > now && c.next < c.end { // its next slot, within its window
			next = c.next
		}
		if sp.clamps == nil {
			sp.clamps = map[string]clampState{}
		}
		sp.clamps[strings.Clone(keys[i])] = clampState{next: next, interval: interval, end: now + span}
	})
	return nil
}

// status reads every key with all their shards locked, so that the figures
// are one instant's, as a reservation would see them; the partners' clamps
// in force on the keys then bound them (clampFigures, as lua/status.lua).
func (m *MemoryStore) status(_ context.Context, q *query) error {
	var shardBuf, lockedBuf [4]*memShard
	shards, locked := m.lockAll(q.dims, q.keys, shardBuf[:0], lockedBuf[:0])
	defer unlockAll(locked)
	dims := make([]algorithms.Dim, len(q.dims))
	ends := make([]float64, len(q.dims)) // the reset of the clamp in force on each key; 0: none
	q.until = q.now
	for i, d := range q.dims {
		sp := m.space(shards[i], nsOf(d))
		q.until = max(q.until, sp.floor(q.keys[i], q.now))
		if c, ok := sp.clamps[q.keys[i]]; ok && q.now < c.end {
			ends[i] = c.end
		}
		st, _ := sp.getAt(q.keys[i], d.kern, q.now)
		dims[i] = algorithms.Dim{Alg: q.algs[i], State: st, Cost: q.costs[i]}
	}
	q.at = q.now
	q.figures = make([]algorithms.Standing, len(dims))
	if q.any {
		q.binding = algorithms.PeekAny(dims, q.now, q.until, q.figures)
	} else {
		q.binding = algorithms.Peek(dims, q.now, q.until, q.figures)
	}
	clampFigures(q.figures, q.costs, ends, q.now, q.until, q.any)
	return nil
}

func (m *MemoryStore) pauseLeft(_ context.Context, ks keyset, now float64) (float64, error) {
	left, keys := 0.0, ks.keys
	m.each(ks, func(_ *memShard, sp *memSpace, _ *dim, i int) {
		if p, ok := sp.paused[keys[i]]; ok {
			left = max(left, p-now)
		}
	})
	return left, nil
}
