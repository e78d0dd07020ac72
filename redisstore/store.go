package redisstore

import (
	"fmt"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore/internal/health"
)

// DefaultTimeout bounds each Redis call unless WithTimeout says otherwise.
const DefaultTimeout = 250 * time.Millisecond

// Store keeps shapers' state in Redis (single node, Sentinel or Cluster),
// so that every process using it shares one budget per key; pass it to
// shaper.New. Each reservation is one Lua script over all its keys, on
// Redis TIME by default, deciding exactly as the memory store does; its
// delay counts from the reply, so no caller departs before its slot. Keys
// never choose their cluster slot (see shaper.Dimension.Slot) and expire
// once equivalent to a cold key. When Redis is down or silent, the failure
// policy answers (WithFailurePolicy); a wrong password or permission, or a
// key holding foreign data, is an error under every policy. docs/REDIS.md
// gives the key layout and the failure rules. It is safe for concurrent use.
type Store struct {
	handle
	r *backend
	f *failover // nil under FailClosed
}

// handle makes a Store a shaper.Store (the store contract is internal).
type handle = store.Handle

// FailurePolicy says what a Store does while Redis is down or silent.
type FailurePolicy struct {
	kind  int
	share float64
}

var (
	// FailClosed (the default) returns an *Error; nothing is admitted.
	FailClosed = FailurePolicy{kind: 0}
	// FailOpen admits every request, unpaced (see Store.Degraded).
	FailOpen = FailurePolicy{kind: 1}
)

// FailLocal paces each process on its own at share (0 < share <= 1) of the
// rate: give each of N processes 1/N and the fleet stays within the contract.
func FailLocal(share float64) FailurePolicy { return FailurePolicy{kind: 2, share: share} }

// String names the policy.
func (p FailurePolicy) String() string {
	switch p.kind {
	case 1:
		return "fail-open"
	case 2:
		return fmt.Sprintf("fail-local(%g)", p.share)
	}
	return "fail-closed"
}

// Option configures New.
type Option func(*config)

type config struct {
	timeout     time.Duration
	clientClock bool
	coalescing  bool
	policy      FailurePolicy
	err         error
}

// WithTimeout bounds each Redis call once it holds a connection (default
// DefaultTimeout); waiting for a connection is bounded by the caller's ctx
// alone. A call past the bound while the server answers nobody is served
// by the failure policy; one past it while the server answers others fails
// alone with an *Error.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.err = &algorithms.ConfigError{Algorithm: "redis-store", Field: "Timeout", Value: d, Reason: "must be > 0"}
		}
		c.timeout = d
	}
}

// WithClientClock makes the scripts decide on the shaper's clock instead of
// Redis TIME (for tests; every host must then agree on the time).
func WithClientClock() Option { return func(c *config) { c.clientClock = true } }

// WithCoalescing turns coalescing on (the default) or off. With it, a
// process keeps few calls in flight per hash slot (two under heavy load, up
// to eight while few callers overlap); the reservations it makes while they
// are in flight go together in the next call, one script execution that
// decides each in turn, with its own cost, slot, MaxQueue and deadline
// decision and its own error, exactly as its own call would have at that
// place in the sequence. A reservation that finds room goes at once, alone,
// so an idle process pays one round trip. Off, every reservation makes its
// own call. Coalescing applies to a *redis.Client (a single node, or
// Sentinel) and a *redis.ClusterClient (one batch per hash slot, never
// spanning two); a Ring or another client makes one call per reservation.
// docs/REDIS.md says more.
func WithCoalescing(on bool) Option { return func(c *config) { c.coalescing = on } }

// WithFailurePolicy sets what the store does while Redis is down (default FailClosed).
func WithFailurePolicy(p FailurePolicy) Option {
	return func(c *config) {
		if p.kind == 2 && !(p.share > 0 && p.share <= 1) {
			c.err = &algorithms.ConfigError{Algorithm: "redis-store", Field: "FailLocal", Value: p.share, Reason: "share must be in (0, 1]"}
		}
		c.policy = p
	}
}

// New returns a store on client. A nil client or an invalid option is
// reported when a shaper is bound to the store (shaper.New, All or Any), as
// a *shaper.ConfigError.
func New(client redis.UniversalClient, opts ...Option) *Store {
	c := config{timeout: DefaultTimeout, coalescing: true}
	for _, o := range opts {
		o(&c)
	}
	if client == nil && c.err == nil {
		c.err = &algorithms.ConfigError{Algorithm: "redis-store", Field: "Client", Value: nil, Reason: "must not be nil"}
	}
	r := &backend{client: client, timeout: c.timeout, clientClock: c.clientClock, served: c.policy.kind != 0, err: c.err, health: health.New(c.timeout)}
	pool := 10 * runtime.GOMAXPROCS(0) // go-redis's default
	switch cl := client.(type) {
	case *redis.Client:
		r.ctxTimeouts, pool = cl.Options().ContextTimeoutEnabled, cl.Options().PoolSize
	case *redis.ClusterClient:
		r.ctxTimeouts, pool = cl.Options().ContextTimeoutEnabled, cl.Options().PoolSize
	case *redis.Ring:
		pool = cl.Options().PoolSize
	}
	r.slots = make(chan struct{}, max(pool, 1))
	if c.coalescing {
		r.lanes = newLanes(client)
	}
	s := &Store{r: r}
	if c.policy.kind == 0 {
		s.handle = store.NewHandle(r)
		return s
	}
	s.f = &failover{redis: r, policy: c.policy}
	if c.policy.kind == 2 {
		s.f.local = memstore.New()
		s.f.twins = store.Of(s.f.local)
	}
	s.handle = store.NewHandle(s.f)
	return s
}

// Close stops renewing the in-flight leases this store holds (each then
// expires after its lease), its subscription to release notices, and
// FailLocal's in-memory store; no goroutine of the store outlives it. After
// it, an in-flight take is refused with an *Error matching ErrClosed (its
// lease would never be renewed); the rest of the store still works. The
// caller owns and closes the client.
func (s *Store) Close() error {
	s.r.closePermits()
	if s.f != nil && s.f.local != nil {
		return s.f.local.Close()
	}
	return nil
}

// Degraded returns how many operations the failure policy served instead of Redis.
func (s *Store) Degraded() uint64 {
	if s.f == nil {
		return 0
	}
	return s.f.degraded.Load()
}

// LeasesLost returns how many in-flight leases this process held that
// Redis no longer had room for when it renewed them: the lease expired (a
// stall of this process, or Redis out of its reach, for most of the lease)
// or Redis lost it (a restart without persistence, a failover to a replica
// that lacked it), and another process was granted the permit before the
// renewal added it back. The limit may have been exceeded while that
// request ran.
func (s *Store) LeasesLost() uint64 { return s.r.permits.leases.lost.Load() }

// Error reports Redis failing under FailClosed or, under every policy, a
// client that cannot work as configured (a wrong password, a missing
// permission). It matches shaper.ErrStoreUnavailable and unwraps to the
// cause.
type Error struct {
	Op     string // "reserve", "cancel", "settle", "pause", "reset", ...
	Err    error
	outage bool // Redis down or silent: a failure policy may serve it
}

// Error says which operation failed and why.
func (e *Error) Error() string {
	return fmt.Sprintf("throttlekit: store unavailable (%s): %v", e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, shaper.ErrStoreUnavailable) true.
func (e *Error) Is(target error) bool { return target == store.ErrUnavailable }

// StateError reports a key holding data the store did not write (another
// program's value, a corrupt state): that call fails alone, nothing is
// overwritten, and no failure policy serves it. It matches
// shaper.ErrInvalidState.
type StateError struct {
	Op        string // "reserve", "cancel", "settle", "pause", ...
	Key       string // after the dimension's Key mapping
	Dimension string
	Reason    string
	Err       error // the server's error
}

// Error names the key, the dimension and what was wrong.
func (e *StateError) Error() string {
	dim := ""
	if e.Dimension != "" {
		dim = fmt.Sprintf(" (dimension %q)", e.Dimension)
	}
	return fmt.Sprintf("throttlekit: %s: key %q%s: %s", e.Op, e.Key, dim, e.Reason)
}

// Unwrap returns the server's error.
func (e *StateError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, shaper.ErrInvalidState) true.
func (e *StateError) Is(target error) bool { return target == store.ErrInvalidState }
