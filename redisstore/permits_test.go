package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"go.uber.org/goleak"
)

// epoch is the fake clock's start in the tests on the client's clock.
var epoch = time.UnixMilli(1_700_000_000_000)

// permitOf returns the permit of key, at most limit held, in the
// in-flight dimension name ("": a shaper of one contract) of the shapers
// under base, on clock (nil: the real one).
func permitOf(base, name, key string, limit int64, lease time.Duration, clock timer.Clock) *store.Permit {
	d := &store.Dim{Name: name, Base: base, Prefix: base, Clock: clock}
	if name != "" {
		d.Prefix += name + ":"
	}
	return &store.Permit{Dim: d, Key: key, Slot: key, Limit: limit, Lease: algorithms.DurationMillis(lease)}
}

// permitStore returns a store on client, closed when the test ends, and
// its backend.
func permitStore(t *testing.T, client redis.UniversalClient, opts ...Option) (*Store, store.Backend) {
	t.Helper()
	s := New(client, append([]Option{WithTimeout(slowMachine)}, opts...)...)
	t.Cleanup(func() { _ = s.Close() })
	return s, store.Of(s)
}

func mustTake(t *testing.T, b store.Backend, p *store.Permit, id string, now float64) store.Taken {
	t.Helper()
	tk, err := b.TakePermit(bg, p, id, now)
	if err != nil {
		t.Fatalf("TakePermit(%q, %q): %v", p.Key, id, err)
	}
	return tk
}

func mustRelease(t *testing.T, b store.Backend, p *store.Permit, l store.Lease) {
	t.Helper()
	if err := b.ReleasePermit(bg, p, l); err != nil {
		t.Fatalf("ReleasePermit(%q, %+v): %v", p.Key, l, err)
	}
}

func inUse(t *testing.T, b store.Backend, p *store.Permit, now float64) int64 {
	t.Helper()
	n, err := b.PermitsInUse(bg, p, now)
	if err != nil {
		t.Fatalf("PermitsInUse(%q): %v", p.Key, err)
	}
	return n
}

// members returns the lease ids p's key holds, sorted.
func members(t *testing.T, c redis.UniversalClient, p *store.Permit) []string {
	t.Helper()
	m, err := c.ZRange(bg, permitKey(p), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(m)
	return m
}

// noticed reports whether ch receives within d.
func noticed(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// The core of the in-flight dimension, on a node and on the 3-master
// cluster: leases are taken up to the limit, a take past it is refused with
// the time until the earliest lease expires; a retried take of a lease held
// counts it once; a release frees its own lease and no other, once; an
// unknown id frees nothing. And every release reaches a waiter registered
// by another store on another client (another process) by pub/sub, n times
// in a row, with its latency logged.
func TestRedisPermits(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	cl := redistest.StartCluster(t)
	for name, clients := range map[string][2]redis.UniversalClient{
		"node":    {srv.Client(), srv.Client()},
		"cluster": {cl.Client(t), cl.Client(t)},
	} {
		t.Run(name, func(t *testing.T) {
			permitsCore(t, clients[0])
			n := 200
			if name == "cluster" {
				n = 50
			}
			permitsFreed(t, clients[0], clients[1], n)
		})
	}
}

func permitsCore(t *testing.T, c redis.UniversalClient) {
	clock := timer.NewFake(epoch)
	now := algorithms.Millis(clock.Now())
	_, b := permitStore(t, c, WithClientClock())
	p := permitOf("tk:core:", "calls", "acct-1", 3, time.Minute, clock)
	for i, id := range []string{"a", "b", "c"} {
		tk := mustTake(t, b, p, id, now+float64(i))
		if !tk.OK || tk.InUse != int64(i+1) || tk.Lease != (store.Lease{ID: id}) || !math.IsInf(tk.Expiry, 1) {
			t.Fatalf("take %d: %+v, want OK with %d in use and lease %q", i, tk, i+1, id)
		}
	}
	if tk := mustTake(t, b, p, "b", now+3); !tk.OK || tk.InUse != 3 {
		t.Fatalf("a retried take of a lease held: %+v, want OK, counted once (3 in use)", tk)
	}
	tk := mustTake(t, b, p, "d", now+10)
	// "a" is the earliest lease: taken at now, it expires at now + 60 s.
	if tk.OK || tk.InUse != 3 || tk.Expiry != 60_000-10 {
		t.Fatalf("a take past the limit: %+v, want refused, 3 in use, expiry in 59990 ms", tk)
	}
	if ttl := c.PTTL(bg, permitKey(p)).Val(); ttl <= 59*time.Second || ttl > time.Minute {
		t.Fatalf("the key's TTL is %v, want its latest lease's expiry (about 60 s)", ttl)
	}
	if n := inUse(t, b, p, now+10); n != 3 {
		t.Fatalf("in use: %d, want 3", n)
	}
	mustRelease(t, b, p, store.Lease{ID: "b"})
	if n, m := inUse(t, b, p, now+11), members(t, c, p); n != 2 || !slices.Equal(m, []string{"a", "c"}) {
		t.Fatalf("after releasing b: %d in use, %v held, want a and c", n, m)
	}
	mustRelease(t, b, p, store.Lease{ID: "b"})    // twice: nothing
	mustRelease(t, b, p, store.Lease{ID: "nope"}) // never granted: nothing
	if n, m := inUse(t, b, p, now+12), members(t, c, p); n != 2 || !slices.Equal(m, []string{"a", "c"}) {
		t.Fatalf("after a double release and an unknown id: %d in use, %v held, want a and c", n, m)
	}
	if tk := mustTake(t, b, p, "d", now+13); !tk.OK || tk.InUse != 3 {
		t.Fatalf("a take after a release: %+v, want OK with 3 in use", tk)
	}
	if m := members(t, c, p); !slices.Equal(m, []string{"a", "c", "d"}) {
		t.Fatalf("held: %v, want a, c and d", m)
	}
	// Another key, another dimension, a shaper of one contract: their own leases.
	for _, q := range []*store.Permit{
		permitOf("tk:core:", "calls", "acct-2", 1, time.Minute, clock),
		permitOf("tk:core:", "other", "acct-1", 1, time.Minute, clock),
		permitOf("tk:core:", "", "acct-1", 1, time.Minute, clock),
	} {
		if tk := mustTake(t, b, q, "a", now+14); !tk.OK || tk.InUse != 1 {
			t.Fatalf("%s: %+v, want OK with 1 in use", permitKey(q), tk)
		}
	}
}

// permitsFreed: store B (its own client: another process) registers for
// the releases of a key; each of n releases by store A reaches it. The
// latency is from the moment A sends its release (so it includes the
// release's own round trip) to B's channel receiving; logged, not bounded
// beyond a sanity limit of 2 s each (a notice that never comes).
func permitsFreed(t *testing.T, ca, cb redis.UniversalClient, n int) {
	_, a := permitStore(t, ca)
	_, b := permitStore(t, cb)
	p := permitOf("tk:freed:", "", "k", 1, time.Minute, nil)
	ch := make(chan struct{}, 1)
	stop := b.Freed(p, ch)
	lat := make([]time.Duration, 0, n)
	for i := range n {
		tk := mustTake(t, a, p, fmt.Sprint("r", i), 0)
		if !tk.OK {
			t.Fatalf("take %d: %+v", i, tk)
		}
		start := time.Now()
		mustRelease(t, a, p, tk.Lease)
		if !noticed(ch, 2*time.Second) {
			t.Fatalf("release %d: no notice within 2 s", i)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	t.Logf("release -> notice in another process, %d releases: p50 %v, p99 %v, max %v", n, lat[n/2], lat[n*99/100], lat[n-1])

	// A release that frees nothing announces nothing.
	mustRelease(t, a, p, store.Lease{ID: "never-granted"})
	if noticed(ch, 200*time.Millisecond) {
		t.Fatal("a release of an unknown id was announced")
	}
	// A channel registered later (another prefix) is subscribed before
	// Freed returns: a release right after it is not missed.
	q := permitOf("tk:freed2:", "calls", "k", 1, time.Minute, nil)
	ch2 := make(chan struct{}, 1)
	stop2 := b.Freed(q, ch2)
	defer stop2()
	tk := mustTake(t, a, q, "x", 0)
	mustRelease(t, a, q, tk.Lease)
	if !noticed(ch2, 2*time.Second) {
		t.Fatal("a release right after Freed on a new channel: no notice within 2 s")
	}
	if noticed(ch, 100*time.Millisecond) {
		t.Fatal("a release of another key reached the first key's listener")
	}
	// Once stopped, nothing more reaches ch.
	stop()
	tk = mustTake(t, a, p, "after-stop", 0)
	mustRelease(t, a, p, tk.Lease)
	if noticed(ch, 200*time.Millisecond) {
		t.Fatal("a notice reached a listener that stopped")
	}
}

// A lease nobody renews expires after its lease and not before, exactly, on
// the client's clock: the take of another id is refused 1 µs before the
// expiry (that µs, as float64 has it at this epoch, its Expiry) and granted
// at it; and the old
// holder's release after the re-grant frees nothing.
func TestRedisPermitLeaseExpiresAfterItsLeaseNotBefore(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	t0 := algorithms.Millis(epoch)
	clock := timer.NewFake(epoch.Add(time.Second)) // the new holder renews from t0 + 1 s
	_, b := permitStore(t, c, WithClientClock())
	p := permitOf("tk:expiry:", "", "k", 1, time.Second, clock)
	// "old" was taken at t0 by a process that died: nobody renews it.
	if err := script.PermitTake.Run(bg, c, []string{permitKey(p), tombKey(permitKey(p))}, script.Float(t0), 1, "1000", "old").Err(); err != nil {
		t.Fatal(err)
	}
	tk := mustTake(t, b, p, "new", t0+999.999)
	if want := (t0 + 1000) - (t0 + 999.999); tk.OK || tk.InUse != 1 || tk.Expiry != want {
		t.Fatalf("1 µs before the expiry: %+v, want refused with 1 in use, expiry in %v ms", tk, want)
	}
	if n := inUse(t, b, p, t0+999.999); n != 1 {
		t.Fatalf("1 µs before the expiry: %d in use, want 1", n)
	}
	if n := inUse(t, b, p, t0+1000); n != 0 {
		t.Fatalf("at the expiry: %d in use, want 0", n)
	}
	if tk := mustTake(t, b, p, "new", t0+1000); !tk.OK || tk.InUse != 1 {
		t.Fatalf("at the expiry: %+v, want OK with 1 in use", tk)
	}
	mustRelease(t, b, p, store.Lease{ID: "old"}) // the old holder comes back
	if n, m := inUse(t, b, p, t0+1000), members(t, c, p); n != 1 || !slices.Equal(m, []string{"new"}) {
		t.Fatalf("after the old holder's release: %d in use, %v held, want the new lease alone", n, m)
	}
}

// On Redis TIME, in real time: a lease whose store closed (its renewer
// stopped: a process that died) still holds 100 ms before its 300 ms lease
// ends, and is free 100 ms after (the tolerance: this host's timers against
// Redis TIME on a busy 2-core machine under -race); its key vanishes with
// it. A refused take's Expiry says when that is.
func TestRedisPermitLeaseExpiresOnRedisTime(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	c := srv.Client()
	const lease, tolerance = 300 * time.Millisecond, 100 * time.Millisecond // tolerance: how far from the lease's end the takes aim
	sa, a := permitStore(t, srv.Client())
	_, b := permitStore(t, c)
	p := permitOf("tk:realtime:", "", "k", 1, lease, nil)
	solo := permitOf("tk:realtime:", "", "solo", 1, lease, nil)
	before := time.Now()
	if tk := mustTake(t, a, p, "dead", 0); !tk.OK {
		t.Fatal(tk)
	}
	if tk := mustTake(t, a, solo, "dead", 0); !tk.OK {
		t.Fatal(tk)
	}
	after := time.Now()
	if err := sa.Close(); err != nil { // its leases are no longer renewed
		t.Fatal(err)
	}
	tk := mustTake(t, b, p, "live", 0)
	if tk.OK || tk.InUse != 1 || tk.Expiry <= 0 || tk.Expiry > algorithms.DurationMillis(lease) {
		t.Fatalf("a take while the lease holds: %+v, want refused with an expiry within the lease", tk)
	}
	// Redis TIME and time.Now read the same host clock: a take granted
	// by a call that returned before the lease could have ended (taken
	// no earlier than before) came too early. A late call on a loaded
	// host proves nothing either way and fails nothing.
	time.Sleep(time.Until(after.Add(lease - tolerance)))
	if tk := mustTake(t, b, p, "live", 0); tk.OK && time.Now().Round(0).Before(before.Round(0).Add(lease)) {
		t.Fatalf("a take returned %v before the lease could end was granted: %+v", time.Until(before.Add(lease)), tk)
	} else if tk.OK {
		t.Logf("the take meant to land %v before the lease's end came after it (a loaded host): not judged", tolerance)
		mustRelease(t, b, p, tk.Lease)
	}
	time.Sleep(time.Until(before.Add(lease + tolerance)))
	if tk := mustTake(t, b, p, "live", 0); !tk.OK {
		t.Fatalf("%v after the lease ended: %+v, want OK", tolerance, tk)
	}
	if n := c.Exists(bg, permitKey(solo)).Val(); n != 0 {
		t.Fatalf("the key of an expired lease still exists")
	}
}

// A process that holds a lease renews it. On the client clock, step by
// step: a 300 ms lease, renewed every 200 ms of the clock, is held at each
// check, every 200 ms for 1.2 s (from the second on, past the take's
// lease: held only by a renewal), and none is lost; once released the permit is free. On
// Redis TIME, the renewer does it on its own: the lease's expiry moves on
// (polled, no bound on when), and the renewer exits once nothing is held.
func TestRedisPermitRenewalKeepsALeaseAlive(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	clock := timer.NewFake(epoch)
	now := func() float64 { return algorithms.Millis(clock.Now()) }
	sa, a := permitStore(t, srv.Client(), WithClientClock())
	_, b := permitStore(t, srv.Client(), WithClientClock())
	p := permitOf("tk:renew:", "calls", "k", 1, 300*time.Millisecond, clock)
	tk := mustTake(t, a, p, "held", now())
	if !tk.OK {
		t.Fatal(tk)
	}
	for i := range 6 { // from the second check on, past the lease of the take
		clock.Jump(200 * time.Millisecond)
		if n := inUse(t, b, p, now()); n != 1 {
			t.Fatalf("check %d, %d renewals: %d in use while the lease is held and renewed, want 1", i+1, i, n)
		}
		renewNow(sa)
	}
	if got := mustTake(t, b, p, "other", now()); got.OK {
		t.Fatalf("after 5 renewals another take was granted: %+v", got)
	}
	if lost := sa.LeasesLost(); lost != 0 {
		t.Fatalf("%d leases lost", lost)
	}
	mustRelease(t, a, p, tk.Lease)
	if got := mustTake(t, b, p, "other", now()); !got.OK {
		t.Fatalf("after the release: %+v, want OK", got)
	}

	c := srv.Client()
	sr, r := permitStore(t, c)
	q := permitOf("tk:renew:", "calls", "on-time", 1, 300*time.Millisecond, nil)
	held := mustTake(t, r, q, "held", 0)
	taken := c.ZScore(bg, permitKey(q), "held").Val()
	for deadline := time.Now().Add(10 * time.Second); c.ZScore(bg, permitKey(q), "held").Val() <= taken; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the renewer never renewed the lease on its own")
		}
	}
	mustRelease(t, r, q, held.Lease)
	waitRenewerGone(t, sr)
}

// renewNow makes every lease s holds due and runs each dimension's round
// at the test's instant (the loops run on their clocks; this runs a round
// now), and returns the first outage it met.
func renewNow(s *Store) error {
	l := &s.r.permits.leases
	l.mu.Lock()
	var dls []*dimLeases
	for _, dl := range l.dims {
		for _, ids := range dl.held {
			for _, h := range ids {
				h.due = dl.clock.Now()
			}
		}
		dls = append(dls, dl)
	}
	l.mu.Unlock()
	var first error
	for _, dl := range dls {
		if err := l.round(s.r, dl, ""); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitRenewerGone waits (at most 2 s) for s's loops to exit.
func waitRenewerGone(t *testing.T, s *Store) {
	t.Helper()
	l := &s.r.permits.leases
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		n := len(l.dims)
		l.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the renewer still runs (%d dimensions with leases)", n)
		}
	}
}

// A lease that expired before its process renewed it (the process stalled
// past its lease: here its clock jumps 1 s, a 300 ms lease) is added back
// by its renewal while the key has room: its request is still open, and
// nobody else holds the permit. Once another process was granted the
// permit meanwhile, the renewal finds the key full: the lease is reported
// lost, counted in LeasesLost, and no longer renewed.
func TestRedisPermitLeasesLostAreCounted(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	clock := timer.NewFake(epoch)
	s, a := permitStore(t, c, WithClientClock())
	_, b := permitStore(t, c, WithClientClock())
	now := func() float64 { return algorithms.Millis(clock.Now()) }
	p := permitOf("tk:lost:", "", "k", 1, 300*time.Millisecond, clock)
	if tk := mustTake(t, a, p, "stalled", now()); !tk.OK {
		t.Fatal(tk)
	}
	clock.Jump(time.Second)
	if err := renewNow(s); err != nil {
		t.Fatal(err)
	}
	if s.LeasesLost() != 0 || !slices.Equal(members(t, c, p), []string{"stalled"}) {
		t.Fatalf("a stalled holder's renewal with the key free: %d lost, %v held; want its lease added back", s.LeasesLost(), members(t, c, p))
	}
	if tk := mustTake(t, b, p, "other", now()); tk.OK {
		t.Fatalf("a take after the lease was added back: %+v, want refused", tk)
	}
	clock.Jump(time.Second)
	if tk := mustTake(t, b, p, "other", now()); !tk.OK {
		t.Fatalf("a take past the lease of a holder that stalled again: %+v, want OK", tk)
	}
	if err := renewNow(s); err != nil {
		t.Fatal(err)
	}
	if lost := s.LeasesLost(); lost != 1 || !slices.Equal(members(t, c, p), []string{"other"}) {
		t.Fatalf("%d leases lost, %v held; want the stalled lease lost, the other held", lost, members(t, c, p))
	}
	waitRenewerGone(t, s)
}

// The failure policies with the server killed: FailClosed returns an
// *Error matching store.ErrUnavailable; FailOpen grants Open leases that
// count nothing; FailLocal grants Local leases from its twin at its share
// of the limit (at least 1), whose releases reach the waiters; each lease
// goes back where it came from. Once Redis is back, leases come from it again.
func TestRedisPermitFailurePolicies(t *testing.T) {
	srv, _ := redisClient(t)
	client := func() *redis.Client {
		return srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 })
	}
	newStore := func(policy FailurePolicy) (*Store, store.Backend) {
		s := New(client(), WithTimeout(100*time.Millisecond), WithFailurePolicy(policy))
		t.Cleanup(func() { _ = s.Close() })
		return s, store.Of(s)
	}
	closedS, closed := newStore(FailClosed)
	openS, open := newStore(FailOpen)
	localS, local := newStore(FailLocal(0.5))
	_, tiny := newStore(FailLocal(0.1))
	p := permitOf("tk:fail:", "", "k", 4, time.Minute, nil)
	redisLease := map[store.Backend]store.Lease{}
	for _, b := range []store.Backend{closed, open, local} {
		tk := mustTake(t, b, p, fmt.Sprintf("redis-%p", b), 0)
		if !tk.OK || tk.Lease.Local || tk.Lease.Open {
			t.Fatalf("with Redis up: %+v, want a lease from Redis", tk)
		}
		redisLease[b] = tk.Lease
	}
	ch := make(chan struct{}, 1)
	stop := local.Freed(p, ch)
	defer stop()
	srv.Kill()

	// FailClosed: errors.
	if _, err := closed.TakePermit(bg, p, "c1", 0); !errors.Is(err, store.ErrUnavailable) || !errors.As(err, new(*Error)) {
		t.Fatalf("FailClosed take: %v, want an *Error matching ErrUnavailable", err)
	}
	if _, err := closed.PermitsInUse(bg, p, 0); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("FailClosed count: %v", err)
	}
	if err := closed.ReleasePermit(bg, p, redisLease[closed]); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("FailClosed release: %v", err)
	}
	if closedS.Degraded() != 0 {
		t.Fatal("FailClosed counted degraded operations")
	}

	// FailOpen: Open leases, nothing counted, no shared figure.
	for i := range 10 {
		tk := mustTake(t, open, p, fmt.Sprint("o", i), 0)
		if !tk.OK || !tk.Lease.Open || tk.Lease.Local || tk.InUse != 0 || tk.Lease.ID != fmt.Sprint("o", i, "/p") {
			t.Fatalf("FailOpen take %d: %+v, want an Open lease", i, tk)
		}
		mustRelease(t, open, p, tk.Lease)
	}
	mustRelease(t, open, p, redisLease[open]) // a Redis lease during the outage: dropped, it expires
	if _, err := open.PermitsInUse(bg, p, 0); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("FailOpen count: %v, want the outage", err)
	}
	if openS.Degraded() < 11 {
		t.Fatalf("FailOpen counted %d degraded operations, want at least 11", openS.Degraded())
	}

	// FailLocal(0.5) of 4: 2 permits for this process on both sides
	// together; it holds one in Redis, so 1 local. Its releases reach the
	// waiters, and so does the release of its Redis lease, which frees its
	// share (Redis gets that release when it answers again).
	var leases []store.Lease
	tk := mustTake(t, local, p, "l0", 0)
	if !tk.OK || !tk.Lease.Local || tk.Lease.Open || tk.InUse != 2 {
		t.Fatalf("FailLocal take 0: %+v, want a Local lease, 2 in use (its Redis lease counted)", tk)
	}
	leases = append(leases, tk.Lease)
	if tk := mustTake(t, local, p, "l1", 0); tk.OK || tk.InUse != 2 {
		t.Fatalf("FailLocal(0.5) of 4, second take: %+v, want refused with 2 in use", tk)
	}
	if n := inUse(t, local, p, 0); n != 2 {
		t.Fatalf("FailLocal count: %d, want the twin's 1 and its Redis lease", n)
	}
	mustRelease(t, local, p, redisLease[local])
	if !noticed(ch, 2*time.Second) {
		t.Fatal("FailLocal: the release of a Redis lease during the outage did not reach the waiter")
	}
	if n := inUse(t, local, p, 0); n != 1 {
		t.Fatalf("FailLocal count after its Redis lease's release: %d, want 1", n)
	}
	if tk := mustTake(t, local, p, "l1", 0); !tk.OK || !tk.Lease.Local || tk.InUse != 2 {
		t.Fatalf("FailLocal take after its Redis lease's release: %+v, want a Local lease, 2 in use", tk)
	} else {
		leases = append(leases, tk.Lease)
	}
	mustRelease(t, local, p, leases[0])
	if !noticed(ch, 2*time.Second) {
		t.Fatal("FailLocal: a local release did not reach the waiter")
	}
	if n := inUse(t, local, p, 0); n != 1 {
		t.Fatalf("FailLocal count after a release: %d, want 1", n)
	}
	if localS.Degraded() == 0 {
		t.Fatal("FailLocal counted no degraded operation")
	}
	// FailLocal(0.1) of 4: floor(0.4) -> at least 1.
	if tk := mustTake(t, tiny, p, "t0", 0); !tk.OK || !tk.Lease.Local {
		t.Fatalf("FailLocal(0.1) first take: %+v", tk)
	}
	if tk := mustTake(t, tiny, p, "t1", 0); tk.OK {
		t.Fatalf("FailLocal(0.1) of 4, second take: %+v, want refused (1 permit)", tk)
	}

	srv.Restart()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tk, err := local.TakePermit(bg, p, "back", 0)
		if err == nil && tk.OK && !tk.Lease.Local {
			break
		}
		if err == nil && tk.OK { // still served by the twin: give it back, or it is registered in Redis once Redis answers
			mustRelease(t, local, p, tk.Lease)
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis is back but FailLocal still answers: %+v %v", tk, err)
		}
	}
	// The local leases still open (this store's l1, and t0 of the
	// FailLocal(0.1) store, registered by its own loop once Redis
	// answered) were registered in Redis before "back" was granted; a
	// release goes to the twin and to Redis.
	for deadline := time.Now().Add(5 * time.Second); !slices.Equal(members(t, srv.Client(), p), []string{"back", "l1/p", "t0/p"}); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Redis holds %v, want the local leases still open and the one taken since it came back", members(t, srv.Client(), p))
		}
	}
	mustRelease(t, local, p, leases[1])
	if n := inUse(t, local, p, 0); n != 2 {
		t.Fatalf("Redis holds %d leases, want the one taken since it came back and t0", n)
	}
}

// A key holding foreign data (a string, or a sorted set with a lease that
// never expires, which the scripts never write) fails each operation with a
// *StateError naming the key and dimension, under every policy, never
// served by it; nothing is written.
func TestRedisPermitForeignDataIsRefused(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	for i, policy := range []FailurePolicy{FailClosed, FailOpen, FailLocal(0.5)} {
		s, b := permitStore(t, c, WithFailurePolicy(policy))
		str := permitOf("tk:foreign:", "calls", fmt.Sprint("string-", i), 2, time.Minute, nil)
		zset := permitOf("tk:foreign:", "calls", fmt.Sprint("zset-", i), 2, time.Minute, nil)
		if err := c.Set(bg, permitKey(str), "someone's value", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.ZAdd(bg, permitKey(zset), redis.Z{Score: math.Inf(1), Member: "forever"}).Err(); err != nil {
			t.Fatal(err)
		}
		check := func(what string, p *store.Permit, err error) {
			t.Helper()
			var se *StateError
			if !errors.As(err, &se) || !errors.Is(err, store.ErrInvalidState) || errors.Is(err, store.ErrUnavailable) || se.Key != p.Key || se.Dimension != "calls" {
				t.Fatalf("%v: %s on %q: %v (%T), want a *StateError naming the key and dimension", policy, what, p.Key, err, err)
			}
		}
		for _, p := range []*store.Permit{str, zset} {
			_, err := b.TakePermit(bg, p, "x", 0)
			check("take", p, err)
			if _, err := s.r.renew(bg, permitKey(p), p, false, time.Now(), []string{"forever"}); !errors.Is(err, store.ErrInvalidState) {
				t.Fatalf("%v: renew on %q: %v, want a *StateError", policy, p.Key, err)
			}
		}
		check("release", str, b.ReleasePermit(bg, str, store.Lease{ID: "x"}))
		_, err := b.PermitsInUse(bg, str, 0)
		check("count", str, err)
		if v := c.Get(bg, permitKey(str)).Val(); v != "someone's value" || c.PTTL(bg, permitKey(str)).Val() != -1 {
			t.Fatalf("%v: the foreign string is now %q, TTL %v", policy, v, c.PTTL(bg, permitKey(str)).Val())
		}
		if m := members(t, c, zset); !slices.Equal(m, []string{"forever"}) || c.PTTL(bg, permitKey(zset)).Val() != -1 {
			t.Fatalf("%v: the foreign set now holds %v, TTL %v", policy, m, c.PTTL(bg, permitKey(zset)).Val())
		}
		if s.Degraded() != 0 {
			t.Fatalf("%v: foreign data was served by the policy", policy)
		}
	}
}

// Close stops every goroutine the in-flight dimension started: the renewer
// of a lease held, the reader of the release notices and go-redis's own for
// the subscription. Not parallel: it compares the goroutines before and after.
func TestRedisPermitsLeaveNoGoroutineAfterClose(t *testing.T) {
	srv := redistest.Start(t)
	before := goleak.IgnoreCurrent()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	for _, policy := range []FailurePolicy{FailClosed, FailLocal(0.5)} {
		s := New(c, WithTimeout(slowMachine), WithFailurePolicy(policy))
		b := store.Of(s)
		p := permitOf("tk:leak:", "", "k", 1, 300*time.Millisecond, nil)
		tk := mustTake(t, b, p, "held", 0)
		stop := b.Freed(p, make(chan struct{}, 1))
		stop2 := b.Freed(permitOf("tk:leak2:", "", "k", 1, time.Minute, nil), make(chan struct{}, 1))
		if !tk.OK {
			t.Fatal(tk)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		stop()
		stop2()
		// After Close: no renewer starts, no subscription is made, and a
		// take is refused with ErrClosed (nothing would renew its lease).
		if tk, err := b.TakePermit(bg, p, "after-close", 0); !errors.Is(err, ErrClosed) || !errors.Is(err, store.ErrUnavailable) || tk.OK {
			t.Fatalf("%v: %+v %v, want an *Error matching ErrClosed", policy, tk, err)
		}
		b.Freed(p, make(chan struct{}, 1))()
		if err := s.Close(); err != nil { // twice: nothing more
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
}

// The margin exactly, on the fake clock (the scripts on the client's clock,
// the renewal loop on the same clock): 1.5 s leases renewed every 300 ms,
// retried every 50 ms. A holds 2 of 2 and is cut off from Redis (its
// connections reset) at the worst instant, 1 ms before a renewal is due
// (1.2 s of lease left), for 1.1 s, just under the margin (lease - period
// - retry): its renewal once Redis answers lands in time and B is refused.
// Cut off past its lease (a process stalled, or cut off, past its lease:
// the documented exception), its leases expire, B is granted them, and A
// counts them lost when it is back.
func TestRedisLeaseMarginOnTheFakeClock(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	for _, c := range []struct {
		cutFor time.Duration
		kept   bool
	}{{1100 * time.Millisecond, true}, {1300 * time.Millisecond, false}} {
		clock := timer.NewFake(epoch)
		now := func() float64 { return algorithms.Millis(clock.Now()) }
		cut := &cutter{resets: true}
		sa := New(srv.Client(faultClient, func(o *redis.Options) { o.Dialer = cut.dial }), WithClientClock(), WithTimeout(100*time.Millisecond))
		t.Cleanup(func() { _ = sa.Close() })
		a := store.Of(sa)
		_, b := permitStore(t, srv.Client(), WithClientClock())
		p := permitOf(fmt.Sprintf("tk:margin%v:", c.cutFor), "calls", "k", 2, 1500*time.Millisecond, clock)
		for _, id := range []string{"a0", "a1"} {
			if tk := mustTake(t, a, p, id, now()); !tk.OK {
				t.Fatal(tk)
			}
		}
		l := &sa.r.permits.leases
		step := func(d time.Duration) { // advance d, and wait for the loop's round that falls due
			before := l.rounds.Load()
			// The loop arms its next timer after a round: under load it may
			// not have yet, and an advance before it would fire nothing.
			armed, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := clock.WaitForTimers(armed, 1); err != nil {
				cancel()
				t.Fatalf("the renewal loop armed no timer: %v", err)
			}
			cancel()
			clock.Advance(d)
			for deadline := time.Now().Add(5 * time.Second); l.rounds.Load() == before; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no renewal round after advancing %v: a failed renewal is not tried again within a retry (50 ms)", d)
				}
			}
		}
		clock.Advance(299 * time.Millisecond) // 1 ms before the first renewal is due
		cut.cut(time.Hour)
		step(time.Millisecond) // the renewal fails
		for elapsed := time.Millisecond; elapsed < c.cutFor; elapsed += 50 * time.Millisecond {
			step(50 * time.Millisecond) // each retry fails
		}
		if !c.kept { // past the lease: B is granted A's permits
			for _, id := range []string{"b0", "b1"} {
				if tk := mustTake(t, b, p, id, now()); !tk.OK {
					t.Fatalf("%v past A's lease: B's take %+v, want granted (the exception)", clock.Now().Sub(epoch), tk)
				}
			}
		}
		cut.cut(0) // healed
		step(50 * time.Millisecond)
		if !c.kept {
			if lost := sa.LeasesLost(); lost != 2 {
				t.Fatalf("cut off past its lease: A counts %d lost, want 2", lost)
			}
			continue
		}
		if tk := mustTake(t, b, p, "b", now()); tk.OK || sa.LeasesLost() != 0 {
			t.Fatalf("cut off for %v (under the margin), renewed at %v: B's take %+v, A lost %d; want refused, none lost",
				c.cutFor, clock.Now().Sub(epoch), tk, sa.LeasesLost())
		}
	}
}

// Releases meet renewals in flight: 8 goroutines take, hold 0 to 3 ms and
// give back permits of a 10 ms lease (renewed every 2 ms) for 300 ms, so
// that many a release comes while the loop renews its lease. Under -race
// (make test) a release reading the lease's state without the lock the
// loop writes it under is reported (seen in examples/inflight-fleet); and
// every permit comes back once they stop. The lease is short on purpose:
// one renewed late on a loaded machine may expire (LeasesLost), which is
// not what this test judges.
func TestRedisPermitReleasesMeetRenewals(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	_, b := permitStore(t, srv.Client())
	p := permitOf("tk:meet:", "calls", "k", 4, 10*time.Millisecond, nil)
	var wg sync.WaitGroup
	var granted atomic.Int64
	stop := time.Now().Add(300 * time.Millisecond)
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for i := 0; time.Now().Before(stop); i++ {
				tk, err := b.TakePermit(bg, p, fmt.Sprintf("%d-%d", g, i), 0)
				if err != nil {
					t.Errorf("TakePermit: %v", err)
					return
				}
				if !tk.OK {
					time.Sleep(time.Millisecond)
					continue
				}
				granted.Add(1)
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				if err := b.ReleasePermit(bg, p, tk.Lease); err != nil {
					t.Errorf("ReleasePermit: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if granted.Load() == 0 {
		t.Fatal("no permit granted")
	}
	start := time.Now()
	for n := inUse(t, b, p, 0); n != 0; n = inUse(t, b, p, 0) {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("%d permits held 2 s after %d grants were given back", n, granted.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
