package shaper

import (
	"context"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
)

const memShards = 64 // a power of two

// DefaultSweepInterval is how often a memory store evicts idle keys unless
// WithSweepInterval says otherwise.
const DefaultSweepInterval = time.Minute

// MemoryStore keeps shaper state in this process: the embedded default, for a
// single process (a fleet shares a budget through NewRedisStore).
//
// It is sharded 64 ways by key, so there is no global lock on the hot path,
// and a reservation on an existing key allocates nothing. Keys whose state is
// equivalent to a cold key (idle long enough that their next request would be
// treated as the first) are evicted by a background sweeper, so memory
// follows the keys in use. Idleness is judged at the latest instant any shaper
// has passed to the store, so shapers sharing a store should share a clock.
//
// With WithMaxKeys, a request for a new key when the store is full first
// evicts idle keys (its own shard's, then, at most every 10 ms, the whole
// store's); if none is idle it fails with ErrStoreFull. A key that is still
// throttled (or paused) is never evicted, so the cap never loosens a contract.
//
// Close stops the sweeper; the store stays usable without it.
type MemoryStore struct {
	seed     maphash.Seed
	shards   [memShards]memShard
	keys     atomic.Int64
	maxKeys  int64
	interval time.Duration
	err      error

	scanMu    sync.Mutex
	scannedAt float64 // store time of the last store-wide scan at the cap

	nsMu sync.Mutex
	ns   map[string]*dim                        // prefix -> the first dimension bound to it
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

// memSpace is one namespace's keys in one shard. The GCRA family (the leaky
// bucket shaper and GCRA) keeps a bare TAT per key in a slab, and the map
// holds the key's index in it: no slice header, no allocation per key, no
// pointer for the collector to follow, and an update is a slab write, not a
// second map operation. The other algorithms keep a State per key.
type memSpace struct {
	alg    algorithms.Algorithm
	gcra   *algorithms.GCRA  // non-nil: states are bare TATs in slab
	index  map[string]uint32 // key -> its TAT's index in slab
	slab   []float64         // TATs; the slots in free are unused
	gens   []uint32          // per slab slot, the generation of its last reservation (see grant)
	free   []uint32          // slab slots of evicted keys, reused first
	states map[string]algorithms.State
	paused map[string]float64 // pauses are rare: nil until the first
}

// add stores a new key's TAT and returns its slab slot; key must already be
// a clone.
func (sp *memSpace) add(key string, tat float64) uint32 {
	var i uint32
	if n := len(sp.free); n > 0 {
		i, sp.free = sp.free[n-1], sp.free[:n-1]
		sp.slab[i] = tat
	} else {
		i = uint32(len(sp.slab))
		sp.slab = append(sp.slab, tat)
		sp.gens = append(sp.gens, 0)
	}
	sp.index[key] = i
	return i
}

// grant gives a reservation on slab slot i its generation: a number no
// other reservation on the key has had lately (it wraps after 2^32), so that
// a Cancel refunds its own slot only, and once. Comparing TATs alone is not
// enough: after a refund the next reservation stores the very TAT the
// cancelled one had.
func (sp *memSpace) grant(i uint32) uint32 {
	sp.gens[i]++
	return sp.gens[i]
}

// drop removes a key of the GCRA family whose slab slot is i.
func (sp *memSpace) drop(key string, i uint32) {
	delete(sp.index, key)
	sp.free = append(sp.free, i)
}

// get returns key's state as a State (a copy for a bare TAT).
func (sp *memSpace) get(key string) (algorithms.State, bool) {
	if sp.gcra != nil {
		i, ok := sp.index[key]
		if !ok {
			return nil, false
		}
		return algorithms.State{sp.slab[i]}, true
	}
	st, ok := sp.states[key]
	return st, ok
}

// put stores the state of a reservation for key and reports whether the key
// is new, and the reservation's generation (GCRA family; 0 otherwise); a new
// key is cloned so that the map does not pin the caller's buffer.
func (sp *memSpace) put(key string, st algorithms.State) (bool, uint32) {
	if sp.gcra != nil {
		if i, ok := sp.index[key]; ok {
			sp.slab[i] = st[0]
			return false, sp.grant(i)
		}
		return true, sp.grant(sp.add(strings.Clone(key), st[0]))
	}
	_, ok := sp.states[key]
	if !ok {
		key = strings.Clone(key)
	}
	sp.states[key] = st
	return !ok, 0
}

// remove deletes key's state and reports whether it held one.
func (sp *memSpace) remove(key string) bool {
	if sp.gcra != nil {
		if i, ok := sp.index[key]; ok {
			sp.drop(key, i)
			return true
		}
		return false
	}
	if _, ok := sp.states[key]; ok {
		delete(sp.states, key)
		return true
	}
	return false
}

// floor returns the instant before which key may not depart: its pause's
// end, or now.
func (sp *memSpace) floor(key string, now float64) float64 {
	if sp.paused != nil {
		if p, ok := sp.paused[key]; ok && p > now {
			return p
		}
	}
	return now
}

// sweep evicts the idle keys (equivalent to a cold key at now, and not
// paused) and returns how many it evicted.
func (sp *memSpace) sweep(now float64) int {
	for k, p := range sp.paused {
		if p <= now {
			delete(sp.paused, k)
		}
	}
	n := 0
	if sp.gcra != nil {
		for k, i := range sp.index {
			if _, reset := sp.gcra.StatusTAT(sp.slab[i], now); reset > 0 {
				continue
			}
			if _, paused := sp.paused[k]; paused {
				continue
			}
			sp.drop(k, i)
			n++
		}
		return n
	}
	for k, st := range sp.states {
		if _, reset := sp.alg.Status(st, now); reset > 0 {
			continue
		}
		if _, paused := sp.paused[k]; paused {
			continue
		}
		delete(sp.states, k)
		n++
	}
	return n
}

// MemoryOption configures NewMemoryStore.
type MemoryOption func(*MemoryStore)

// WithMaxKeys caps the number of keys held (0, the default, means no cap).
func WithMaxKeys(n int) MemoryOption {
	return func(m *MemoryStore) {
		if n < 0 {
			m.err = &ConfigError{Algorithm: "memory-store", Field: "MaxKeys", Value: n, Reason: "must be >= 0"}
		}
		m.maxKeys = int64(n)
	}
}

// WithSweepInterval sets how often idle keys are evicted in the background
// (default DefaultSweepInterval). 0 disables the background sweeper; Sweep
// can still be called.
func WithSweepInterval(d time.Duration) MemoryOption {
	return func(m *MemoryStore) {
		if d < 0 {
			m.err = &ConfigError{Algorithm: "memory-store", Field: "SweepInterval", Value: d, Reason: "must be >= 0"}
		}
		m.interval = d
	}
}

// NewMemoryStore returns an in-memory store. An invalid option is reported by
// New or All when a shaper is bound to the store.
func NewMemoryStore(opts ...MemoryOption) *MemoryStore {
	m := &MemoryStore{seed: maphash.MakeSeed(), interval: DefaultSweepInterval, ns: map[string]*dim{}}
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

// Close stops the background sweeper and waits for it to exit. It is safe to
// call more than once; the store remains usable.
func (m *MemoryStore) Close() error {
	m.closeOnce.Do(func() {
		if m.stop != nil {
			close(m.stop)
			<-m.done
		}
	})
	return nil
}

// Len returns the number of keys held.
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

// Sweep evicts every idle key now and returns how many it evicted. The
// background sweeper calls it every sweep interval.
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
	if g, ok := sp.alg.(*algorithms.GCRA); ok {
		sp.gcra, sp.index = g, map[string]uint32{}
	} else {
		sp.states = map[string]algorithms.State{}
	}
	sh.spaces[ns] = sp
	return sp
}

// bind gives the dimension a namespace id. Shapers may share a prefix (and so
// their keys' budgets) only with the same algorithm, rate and MaxQueue.
func (m *MemoryStore) bind(d *dim) error {
	if m.err != nil {
		return m.err
	}
	m.nsMu.Lock()
	defer m.nsMu.Unlock()
	if prev, ok := m.ns[d.prefix]; ok {
		if prev.identity != d.identity {
			return &ConfigError{Algorithm: "memory-store", Field: "Prefix", Value: d.prefix,
				Reason: "already used by a shaper with " + prev.identity + "; give each shaper its own WithName or WithPrefix"}
		}
		d.memID = prev.memID
		return nil
	}
	algs := slices.Clone(*m.algs.Load())
	d.memID = uint32(len(algs))
	m.algs.Store(new(append(algs, d.alg)))
	m.ns[d.prefix] = d
	return nil
}

func (m *MemoryStore) shardIndex(ns uint32, key string) int {
	h := maphash.String(m.seed, key) ^ uint64(ns)*0x9E3779B97F4A7C15
	return int((h ^ h>>32) & (memShards - 1))
}

func (m *MemoryStore) shard(ns uint32, key string) *memShard {
	return &m.shards[m.shardIndex(ns, key)]
}

// fullScanEvery bounds how often (in store time, ms) a store at its cap scans
// every shard for idle keys, so that a flood of new keys against a store full
// of throttled keys costs one scan, not one per request.
const fullScanEvery = 10.0

// room reports whether n new keys may be added. At the cap it evicts the idle
// keys of sh (whose lock the caller holds), then, at most once per
// fullScanEvery, those of every other shard it can lock without waiting
// (TryLock: a shard held by another transition is skipped, so this can never
// deadlock with lockAll's ordered locking).
func (m *MemoryStore) room(sh *memShard, now float64, n int64) bool {
	fits := func() bool { return m.keys.Load()+n <= m.maxKeys }
	if m.maxKeys == 0 || fits() {
		return true
	}
	if m.sweepShard(sh, now); fits() {
		return true
	}
	m.scanMu.Lock()
	due := now-m.scannedAt >= fullScanEvery
	if due {
		m.scannedAt = now
	}
	m.scanMu.Unlock()
	if !due {
		return false
	}
	for i := range m.shards {
		other := &m.shards[i]
		if other == sh || !other.mu.TryLock() {
			continue
		}
		m.sweepShard(other, now)
		other.mu.Unlock()
		if fits() {
			return true
		}
	}
	return fits()
}

// enter locks key's shard, records now as seen by it, and returns the shard
// with namespace ns's space in it; the caller unlocks sh.mu.
func (m *MemoryStore) enter(ns uint32, key string, now float64) (*memShard, *memSpace) {
	sh := m.shard(ns, key)
	sh.mu.Lock()
	sh.high = max(sh.high, now)
	return sh, m.space(sh, ns)
}

func (m *MemoryStore) reserve(_ context.Context, d *dim, alg algorithms.Algorithm, key string, cost int64, now float64) (algorithms.Decision, float64, uint32, bool, error) {
	if g, ok := alg.(*algorithms.GCRA); ok {
		var dec algorithms.Decision
		tag, gen, err := m.reserveTAT(d, g, key, cost, now, &dec)
		return dec, tag, gen, false, err
	}
	sh, sp := m.enter(d.memID, key, now)
	defer sh.mu.Unlock()
	st, exists := sp.states[key]
	if !exists && !m.room(sh, now, 1) {
		return algorithms.Decision{}, 0, 0, false, ErrStoreFull
	}
	next, dec, err := algorithms.ReserveNotBefore(alg, st, now, sp.floor(key, now), cost)
	if err != nil || !dec.Allowed {
		return dec, 0, 0, false, err
	}
	switch {
	case !exists:
		sp.put(key, next)
		m.keys.Add(1)
	case len(next) != len(st) || &next[0] != &st[0]:
		sp.states[key] = next
	}
	return dec, next[0], 0, false, nil
}

// reserveTAT is reserve for the GCRA family (g is d's leaky bucket or its
// Allow form), whose keys hold a bare TAT: concrete calls, one lookup and
// one store, and the decision written once, to *dec. The Shaper calls it
// directly on its hot path. It returns the stored TAT and the generation
// (see grant): the reservation's tag.
func (m *MemoryStore) reserveTAT(d *dim, g *algorithms.GCRA, key string, cost int64, now float64, dec *algorithms.Decision) (float64, uint32, error) {
	sh, sp := m.enter(d.memID, key, now)
	defer sh.mu.Unlock()
	i, exists := sp.index[key]
	tat := algorithms.ColdTAT
	if exists {
		tat = sp.slab[i]
	} else if !m.room(sh, now, 1) {
		*dec = algorithms.Decision{}
		return 0, 0, ErrStoreFull
	}
	next, err := g.ReserveTAT(tat, now, sp.floor(key, now), cost, dec)
	if err != nil || !dec.Allowed {
		return 0, 0, err
	}
	if exists {
		sp.slab[i] = next
	} else {
		i = sp.add(strings.Clone(key), next) // do not pin the caller's buffer
		m.keys.Add(1)
	}
	return next, sp.grant(i), nil
}

// seedTAT raises key's TAT in d's space to at least tat (the GCRA family
// only): the RedisStore keeps its FailLocal twin's schedule level with
// Redis's. A new key that does not fit under MaxKeys is not seeded.
func (m *MemoryStore) seedTAT(d *dim, key string, tat, now float64) {
	sh, sp := m.enter(d.memID, key, now)
	defer sh.mu.Unlock()
	if sp.gcra == nil {
		return
	}
	if i, ok := sp.index[key]; ok {
		if tat > sp.slab[i] {
			sp.slab[i] = tat
		}
		return
	}
	if m.room(sh, now, 1) {
		_ = sp.add(strings.Clone(key), tat)
		m.keys.Add(1)
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
		j := m.shardIndex(dims[i].memID, keys[i])
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
	floor, fresh := req.now, int64(0)
	for i, d := range req.dims {
		sh := shards[i]
		sp := m.space(sh, d.memID)
		spaces[i] = sp
		sh.high = max(sh.high, req.now)
		floor = max(floor, sp.floor(req.keys[i], req.now))
		st, exists := sp.get(req.keys[i])
		if !exists {
			fresh++
		}
		dims[i] = algorithms.Dim{Alg: req.algs[i], State: st, Cost: req.costs[i]}
	}
	if fresh > 0 {
		for _, sh := range locked {
			if m.room(sh, req.now, fresh) {
				break
			}
		}
		if m.maxKeys > 0 && m.keys.Load()+fresh > m.maxKeys {
			return ErrStoreFull
		}
	}
	dec, err := algorithms.AllNotBefore(dims, req.now, floor)
	req.dec = dec
	if err != nil {
		if dec.Binding >= 0 && dec.Binding < n {
			return wrapDimErr(req.dims[dec.Binding], err)
		}
		return err
	}
	if !dec.Allowed {
		return nil
	}
	req.tags, req.gens = req.tags[:0], req.gens[:0] // newMulti's arrays: no allocation up to four dimensions
	for i := range dims {
		// Counted by put: room may have evicted an idle key read above.
		fresh, gen := spaces[i].put(req.keys[i], dims[i].State)
		if fresh {
			m.keys.Add(1)
		}
		req.tags, req.gens = append(req.tags, dims[i].State[0]), append(req.gens, gen)
	}
	return nil
}

// each runs f on every (dimension, key) pair with the key's shard locked.
func (m *MemoryStore) each(dims []*dim, keys []string, f func(sh *memShard, sp *memSpace, d *dim, i int)) {
	for i, d := range dims {
		sh := m.shard(d.memID, keys[i])
		sh.mu.Lock()
		f(sh, m.space(sh, d.memID), d, i)
		sh.mu.Unlock()
	}
}

// cancel refunds each key whose schedule still ends with this very
// reservation: its TAT and its generation both match. A refund bumps the
// generation, so a second Cancel of the same reservation (a copy of it)
// refunds nothing, even after a newer reservation stored the same TAT.
func (m *MemoryStore) cancel(_ context.Context, dims []*dim, keys []string, tags []float64, gens []uint32, costs []int64, _ bool) error {
	m.each(dims, keys, func(_ *memShard, sp *memSpace, d *dim, i int) {
		if d.gcra == nil || sp.gcra == nil { // only the GCRA family refunds; its keys are bare TATs
			return
		}
		if j, ok := sp.index[keys[i]]; ok && sp.gens[j] == gens[i] {
			var refunded bool
			if sp.slab[j], refunded = d.gcra.CancelTAT(sp.slab[j], tags[i], costs[i]); refunded {
				sp.gens[j]++
			}
		}
	})
	return nil
}

func (m *MemoryStore) pause(_ context.Context, dims []*dim, keys []string, now, d float64) error {
	until := now + d
	m.each(dims, keys, func(_ *memShard, sp *memSpace, _ *dim, i int) {
		if sp.paused == nil {
			sp.paused = map[string]float64{}
		}
		if p, ok := sp.paused[keys[i]]; !ok || until > p {
			sp.paused[strings.Clone(keys[i])] = until
		}
	})
	return nil
}

func (m *MemoryStore) reset(_ context.Context, dims []*dim, keys []string) error {
	m.each(dims, keys, func(_ *memShard, sp *memSpace, _ *dim, i int) {
		if sp.remove(keys[i]) {
			m.keys.Add(-1)
		}
		delete(sp.paused, keys[i])
	})
	return nil
}

func (m *MemoryStore) pauseLeft(_ context.Context, dims []*dim, keys []string, now float64) (float64, error) {
	left := 0.0
	m.each(dims, keys, func(_ *memShard, sp *memSpace, _ *dim, i int) {
		if p, ok := sp.paused[keys[i]]; ok {
			left = max(left, p-now)
		}
	})
	return left, nil
}
