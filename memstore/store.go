package memstore

import (
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// ErrFull is what a store at its WithMaxKeys cap returns for a new entry
// when no entry is idle: the call fails and nothing is written.
var ErrFull = errors.New("throttlekit: memory store is full (MaxKeys) and no key is idle")

// DefaultSweepInterval is how often a store evicts idle keys by default.
const DefaultSweepInterval = time.Minute

// Store keeps shapers' state in this process; pass it to shaper.New. It is
// sharded, with no global lock on the hot path and no allocation per
// reservation on an existing key. Keys idle long enough to be equivalent
// to a cold key are evicted by a background sweeper; WithMaxKeys caps the
// entries held, never evicting a key that is still throttled or paused.
// Shapers sharing a store should share a clock: idleness is judged at the
// latest instant any passed. It is safe for concurrent use.
type Store struct {
	handle
	m *mem
}

// handle makes a Store a shaper.Store (the store contract is internal).
type handle = store.Handle

// Option configures New.
type Option func(*mem)

// WithMaxKeys caps the entries held (a key's state and a key's pause each
// count; 0, the default, means no cap). At the cap a new entry evicts an idle
// one, or fails with ErrFull if none is idle.
func WithMaxKeys(n int) Option {
	return func(m *mem) {
		if n < 0 {
			m.err = &algorithms.ConfigError{Algorithm: "memory-store", Field: "MaxKeys", Value: n, Reason: "must be >= 0"}
		}
		m.maxKeys = int64(n)
	}
}

// WithSweepInterval sets how often idle keys are evicted in the background
// (default DefaultSweepInterval; 0 disables the sweeper).
func WithSweepInterval(d time.Duration) Option {
	return func(m *mem) {
		if d < 0 {
			m.err = &algorithms.ConfigError{Algorithm: "memory-store", Field: "SweepInterval", Value: d, Reason: "must be >= 0"}
		}
		m.interval = d
	}
}

// New returns an in-memory store. An invalid option is reported when a
// shaper is bound to the store (shaper.New, All or Any), as a
// *shaper.ConfigError.
func New(opts ...Option) *Store {
	m := &mem{seed: maphash.MakeSeed(), interval: DefaultSweepInterval, ns: map[string]memNamespace{}}
	for _, o := range opts {
		o(m)
	}
	m.algs.Store(&[]algorithms.Algorithm{})
	if m.err == nil && m.interval > 0 {
		m.stop, m.done = make(chan struct{}), make(chan struct{})
		go m.sweeper()
	}
	return &Store{handle: store.NewHandle(m), m: m}
}

// Close stops the background sweeper and waits for it; the store stays usable.
func (s *Store) Close() error {
	m := s.m
	m.closeOnce.Do(func() {
		if m.stop != nil {
			close(m.stop)
			<-m.done
		}
	})
	return nil
}

// Len returns the number of entries held, as WithMaxKeys counts them.
func (s *Store) Len() int { return int(s.m.keys.Load()) }

// Sweep evicts every idle key now and returns how many it evicted.
func (s *Store) Sweep() int { return s.m.sweep() }

const memShards = 64 // a power of two

// mem is the store's backend: the store contract, implemented.
type mem struct {
	seed     maphash.Seed
	shards   [memShards]memShard
	keys     atomic.Int64
	maxKeys  int64
	interval time.Duration
	err      error

	capMu sync.Mutex // guards capH (see cap.go)
	capH  capHeap

	recMu   sync.Mutex
	records map[string]*memRecord // prefix -> its live contract (see contract.go)

	nsMu sync.Mutex
	ns   map[string]memNamespace                // prefix -> its namespace
	algs atomic.Pointer[[]algorithms.Algorithm] // namespace id -> algorithm, copy on write

	permits permits // the in-flight dimension's leases (permits.go)
	turns   turns   // the fair turns of the flows waiting on a key (turns.go)
	learned learned // what shapers learned of each partner key (learned.go)

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

var (
	_ store.Backend = (*mem)(nil)
	_ store.OneKey  = (*mem)(nil)
	_ store.Seeder  = (*mem)(nil)
)

// Remote is false: the store decides on the shaper's clock, in process.
func (m *mem) Remote() bool { return false }

func (m *mem) sweeper() {
	defer close(m.done)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sweep()
		}
	}
}

// sweep evicts every idle key now and returns how many it evicted.
func (m *mem) sweep() int {
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
func (m *mem) sweepShard(sh *memShard, now float64) int {
	n := 0
	for _, sp := range sh.spaces {
		if sp != nil {
			n += sp.sweep(now)
		}
	}
	m.keys.Add(int64(-n))
	return n
}
