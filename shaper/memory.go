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

type memKey struct {
	ns  uint32
	key string
}

type memShard struct {
	mu     sync.Mutex
	states map[memKey]algorithms.State
	paused map[memKey]float64 // pauses are rare: kept apart so entries stay small
	high   float64            // the latest now seen by this shard
	_      [40]byte           // keep shards on separate cache lines
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
	for i := range m.shards {
		m.shards[i].states = map[memKey]algorithms.State{}
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
	algs := *m.algs.Load()
	n := 0
	for k, p := range sh.paused {
		if p <= now {
			delete(sh.paused, k)
		}
	}
	for k, st := range sh.states {
		if _, reset := algs[k.ns].Status(st, now); reset > 0 {
			continue
		}
		if _, paused := sh.paused[k]; paused {
			continue
		}
		delete(sh.states, k)
		n++
	}
	m.keys.Add(int64(-n))
	return n
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

func (m *MemoryStore) reserve(_ context.Context, d *dim, alg algorithms.Algorithm, key string, cost int64, now float64) (algorithms.Decision, float64, error) {
	k := memKey{d.memID, key}
	sh := m.shard(k.ns, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.high = max(sh.high, now)
	floor := now
	if len(sh.paused) > 0 {
		floor = max(floor, sh.paused[k])
	}
	st, exists := sh.states[k]
	if !exists && !m.room(sh, now, 1) {
		return algorithms.Decision{}, 0, ErrStoreFull
	}
	next, dec, err := algorithms.ReserveNotBefore(alg, st, now, floor, cost)
	if err != nil || !dec.Allowed {
		return dec, 0, err
	}
	switch {
	case !exists:
		k.key = strings.Clone(key) // do not pin the caller's buffer
		sh.states[k] = next
		m.keys.Add(1)
	case len(next) != len(st) || &next[0] != &st[0]:
		sh.states[k] = next
	}
	return dec, next[0], nil
}

// lockAll locks the shards of keys in index order (so that concurrent
// multi-key transitions cannot deadlock). It returns each key's shard, and
// the distinct shards it locked, for unlockAll.
func (m *MemoryStore) lockAll(dims []*dim, keys []string) (perKey, locked []*memShard) {
	idx := make([]int, len(keys))
	perKey = make([]*memShard, len(keys))
	for i := range keys {
		idx[i] = m.shardIndex(dims[i].memID, keys[i])
		perKey[i] = &m.shards[idx[i]]
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	locked = make([]*memShard, len(idx))
	for i, j := range idx {
		locked[i] = &m.shards[j]
		locked[i].mu.Lock()
	}
	return perKey, locked
}

func unlockAll(shards []*memShard) {
	for _, sh := range shards {
		sh.mu.Unlock()
	}
}

func (m *MemoryStore) reserveAll(_ context.Context, req *multi) error {
	shards, locked := m.lockAll(req.dims, req.keys)
	defer unlockAll(locked)
	n := len(req.dims)
	dims := make([]algorithms.Dim, n)
	keys := make([]memKey, n)
	exists := make([]bool, n)
	floor, fresh := req.now, int64(0)
	for i, d := range req.dims {
		keys[i] = memKey{d.memID, req.keys[i]}
		sh := shards[i]
		sh.high = max(sh.high, req.now)
		if len(sh.paused) > 0 {
			floor = max(floor, sh.paused[keys[i]])
		}
		var st algorithms.State
		if st, exists[i] = sh.states[keys[i]]; !exists[i] {
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
	req.tags = make([]float64, n)
	for i := range dims {
		sh := shards[i]
		if !exists[i] {
			keys[i].key = strings.Clone(keys[i].key)
			m.keys.Add(1)
		}
		sh.states[keys[i]] = dims[i].State
		req.tags[i] = dims[i].State[0]
	}
	return nil
}

func (m *MemoryStore) cancel(_ context.Context, dims []*dim, keys []string, tags []float64, costs []int64) error {
	for i, d := range dims {
		if d.gcra == nil {
			continue
		}
		k := memKey{d.memID, keys[i]}
		sh := m.shard(k.ns, k.key)
		sh.mu.Lock()
		if st, ok := sh.states[k]; ok {
			d.gcra.Cancel(st, tags[i], costs[i]) // in place
		}
		sh.mu.Unlock()
	}
	return nil
}

func (m *MemoryStore) pause(_ context.Context, dims []*dim, keys []string, now, d float64) error {
	until := now + d
	for i, d := range dims {
		k := memKey{d.memID, keys[i]}
		sh := m.shard(k.ns, k.key)
		sh.mu.Lock()
		if sh.paused == nil {
			sh.paused = map[memKey]float64{}
		}
		if until > sh.paused[k] {
			k.key = strings.Clone(k.key)
			sh.paused[k] = until
		}
		sh.mu.Unlock()
	}
	return nil
}

func (m *MemoryStore) reset(_ context.Context, dims []*dim, keys []string) error {
	for i, d := range dims {
		k := memKey{d.memID, keys[i]}
		sh := m.shard(k.ns, k.key)
		sh.mu.Lock()
		if _, ok := sh.states[k]; ok {
			delete(sh.states, k)
			m.keys.Add(-1)
		}
		delete(sh.paused, k)
		sh.mu.Unlock()
	}
	return nil
}

func (m *MemoryStore) pauseLeft(_ context.Context, dims []*dim, keys []string, now float64) (float64, error) {
	left := 0.0
	for i, d := range dims {
		k := memKey{d.memID, keys[i]}
		sh := m.shard(k.ns, k.key)
		sh.mu.Lock()
		if p, ok := sh.paused[k]; ok {
			left = max(left, p-now)
		}
		sh.mu.Unlock()
	}
	return left, nil
}
