package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/script"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The in-flight dimension under Redis faults (issue 37, defects 8 to 16):
// real redis-server processes paused (SIGSTOP), killed and restarted (on
// their AOF, or empty), stalled (DEBUG SLEEP), holding foreign data. These
// tests use only what the store had before issue 37 (the backend's
// TakePermit, ReleasePermit and PermitsInUse, the shaper, LeasesLost and
// Degraded), so that each can be run on 0d46bc9 and seen to fail there.

// deployment is where a test's stores run: a node or the 3-master cluster,
// and the server that owns a test's keys, to fault.
type deployment struct {
	name string
	// client returns a new client (another process's), which cut, if not
	// nil, can cut off from Redis.
	client func(cut *cutter) redis.UniversalClient
	owner  func(key string) *redistest.Server
}

// faultClient is how the stores under test connect: ctx deadlines on the
// socket, no retries (a retried take would hide what the store does).
func faultClient(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 }

// laggy delays, on its clients' connections, every write that holds the
// given bytes (a script's SHA, or either of two) by lag, as a slow link would: the bytes are
// sent in order after lag, even if the client has closed the connection
// meanwhile (they were on the wire). Other writes are not delayed, so that
// a command sent later on another connection can overtake it.
type laggy struct {
	match []byte
	or    []byte // if set, another's bytes delayed the same way
	lag   time.Duration
	wg    sync.WaitGroup // the delayed writes in flight
}

type laggyConn struct {
	net.Conn
	l       *laggy
	pending sync.WaitGroup // its delayed writes
}

// client returns a new client of d whose connections l delays.
func (l *laggy) client(d deployment) redis.UniversalClient {
	if d.name == "node" {
		return d.owner("").Client(faultClient, func(o *redis.Options) { o.Dialer = l.dial })
	}
	c := d.client(nil)
	c.(*redis.ClusterClient).Options().Dialer = l.dial
	return c
}

func (l *laggy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &laggyConn{Conn: c, l: l}, nil
}

func (c *laggyConn) Write(b []byte) (int, error) {
	if !bytes.Contains(b, c.l.match) && (c.l.or == nil || !bytes.Contains(b, c.l.or)) {
		c.pending.Wait() // in order behind a delayed write
		return c.Conn.Write(b)
	}
	buf := bytes.Clone(b)
	c.pending.Add(1)
	c.l.wg.Add(1)
	go func() {
		defer c.l.wg.Done()
		defer c.pending.Done()
		time.Sleep(c.l.lag)
		_ = c.Conn.SetWriteDeadline(time.Time{})
		_, _ = c.Conn.Write(buf)
	}()
	return len(b), nil
}

// Close closes the connection once its delayed writes are on the wire.
func (c *laggyConn) Close() error {
	c.l.wg.Add(1)
	go func() {
		defer c.l.wg.Done()
		c.pending.Wait()
		_ = c.Conn.Close()
	}()
	return nil
}

// cutter cuts one process off from Redis while Redis serves the others: its
// clients' connections are closed and their dials refused (a network
// partition of that process).
//
// With resets, a dial during the cut succeeds and the connection's I/O
// fails (reset) instead: go-redis's pool, after as many refused dials as
// its size, stops dialling and probes once a second (its dial circuit
// breaker), which a test on a fake clock cannot wait for.
type cutter struct {
	mu     sync.Mutex
	until  time.Time
	resets bool
	conns  map[net.Conn]struct{}
}

// cutNow reports whether the process is cut off.
func (c *cutter) cutNow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Before(c.until)
}

// resetConn is a connection whose I/O fails while its cutter cuts.
type resetConn struct {
	net.Conn
	c *cutter
}

func (r resetConn) Read(b []byte) (int, error) {
	if r.c.cutNow() {
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return r.Conn.Read(b)
}

func (r resetConn) Write(b []byte) (int, error) {
	if r.c.cutNow() {
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return r.Conn.Write(b)
}

// dial is the clients' Dialer.
func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Now().Before(c.until) && !c.resets {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		if c.conns == nil {
			c.conns = map[net.Conn]struct{}{}
		}
		c.conns[conn] = struct{}{}
		if c.resets {
			return resetConn{conn, c}, nil
		}
	}
	return conn, err
}

// cut cuts the process off for d.
func (c *cutter) cut(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.until = time.Now().Add(d)
	for conn := range c.conns {
		_ = conn.Close()
	}
	clear(c.conns)
}

// deployments starts a node (with extra arguments) and, unless nodeOnly, the
// 3-master cluster.
func deployments(t *testing.T, nodeOnly bool, extra ...string) []deployment {
	t.Helper()
	srv := redistest.Start(t, extra...)
	out := []deployment{{
		name: "node",
		client: func(cut *cutter) redis.UniversalClient {
			return srv.Client(faultClient, func(o *redis.Options) {
				if cut != nil {
					o.Dialer = cut.dial
				}
			})
		},
		owner: func(string) *redistest.Server { return srv },
	}}
	if nodeOnly {
		return out
	}
	cl := redistest.StartCluster(t)
	out = append(out, deployment{
		name: "cluster",
		client: func(cut *cutter) redis.UniversalClient {
			o := &redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true, MaxRetries: -1}
			if cut != nil {
				o.Dialer = cut.dial
			}
			c := redis.NewClusterClient(o)
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		owner: func(key string) *redistest.Server {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
			defer c.Close()
			m, err := c.MasterForKey(bg, key)
			if err != nil {
				t.Fatal(err)
			}
			return cl.Node(m.Options().Addr)
		},
	})
	return out
}

// faultStore returns a store on a new client of d (another process, which
// cut, if not nil, can cut off), with a short timeout so that an outage is
// seen within a tenth of a second, and with a few connections open (as a
// busy process has: a call during a stall is sent, not stuck dialling),
// and the permit scripts loaded (a take during a stall is the script, not
// an EVALSHA whose NOSCRIPT never comes back).
func faultStore(t *testing.T, d deployment, cut *cutter, opts ...Option) (*Store, store.Backend) {
	t.Helper()
	s := New(d.client(cut), append([]Option{WithTimeout(100 * time.Millisecond)}, opts...)...)
	t.Cleanup(func() { _ = s.Close() })
	b := store.Of(s)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			// A key in each master's slots, on the cluster: {0}..{7} spread over all three.
			warm := permitOf("tk:warm:", "", fmt.Sprint(i), 1, time.Second, nil)
			if tk, err := b.TakePermit(bg, warm, fmt.Sprintf("warm-%p", s), 0); err == nil && tk.OK {
				_ = b.ReleasePermit(bg, warm, tk.Lease)
			}
		})
	}
	wg.Wait()
	return s, b
}

// takeAll takes up to n leases on p for b, named prefix0, prefix1, ...,
// and returns those granted (errors and refusals count as not granted).
func takeAll(b store.Backend, p *store.Permit, prefix string, n int) []store.Lease {
	var out []store.Lease
	for i := range n {
		if tk, err := b.TakePermit(bg, p, fmt.Sprint(prefix, i), 0); err == nil && tk.OK {
			out = append(out, tk.Lease)
		}
	}
	return out
}

// Defect 8. A process keeps its live leases through a break in reaching
// Redis shorter than most of their lease: here 1.5 s leases, A holding 2 of
// 2, and A cut off from Redis (its connections closed, its dials refused,
// Redis serving B) for 1.05 s right after a renewal or for 675 ms spanning
// two renewals (from 450 ms after one), or the node killed and restarted on
// its AOF after as long. Throughout, and for a whole lease after, another
// process (B) asks for a permit every 20 ms and is never granted one: A's
// requests are still open. Before the fix A renewed every 500 ms, set the
// next try before the call and skipped a failed one (or found Redis judged
// down), so its next renewal came when its leases had expired: B was
// granted 2 (4 open, limit 2).
//
// Real time, on Redis TIME, with this tolerance: A renews every 300 ms and
// after a failure tries again within 50 ms; the break starts just after a
// renewal (the test watches the lease's score move), so A's renewal lands
// about 300 ms before its leases would end (a restart adds its launch
// time, tens of ms): a stall of this host longer than that would fail the
// test (the documented exception: a process stalled past its lease).
func TestRedisLeasesOutliveABreakShorterThanTheirMargin(t *testing.T) {
	t.Parallel()
	deps := deployments(t, false, "--appendonly", "yes", "--appendfsync", "always")
	cases := []struct {
		name          string
		after, outage time.Duration
		restart       bool // kill, and restart on the AOF (node only); else A is cut off
	}{
		{"A cut off for 1.05 s after a renewal", 0, 1050 * time.Millisecond, false},
		{"A cut off for 675 ms across two renewals", 450 * time.Millisecond, 675 * time.Millisecond, false},
		{"restarted on its AOF after 1.05 s", 0, 1050 * time.Millisecond, true},
		{"restarted on its AOF after 675 ms, across two renewals", 450 * time.Millisecond, 675 * time.Millisecond, true},
	}
	for _, d := range deps {
		for i, c := range cases {
			if c.restart && d.name != "node" {
				continue
			}
			t.Run(d.name+"/"+c.name, func(t *testing.T) {
				cut := &cutter{}
				sa, a := faultStore(t, d, cut)
				_, b := faultStore(t, d, nil)
				p := permitOf(fmt.Sprintf("tk:break%d:", i), "calls", "k", 2, 1500*time.Millisecond, nil)
				if len(takeAll(a, p, "a", 2)) != 2 {
					t.Fatal("A could not take 2 of 2")
				}
				srv, watch := d.owner(permitKey(p)), d.client(nil)
				first := watch.ZScore(bg, permitKey(p), "a0").Val()
				for deadline := time.Now().Add(3 * time.Second); watch.ZScore(bg, permitKey(p), "a0").Val() <= first; time.Sleep(2 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("A never renewed its lease")
					}
				}
				time.Sleep(c.after)
				end := time.Now().Add(c.outage + 1500*time.Millisecond) // a whole lease after the break
				if c.restart {
					srv.Kill()
					time.Sleep(c.outage)
					srv.Restart()
				} else {
					cut.cut(c.outage) // B asks throughout
				}
				for ; time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
					if got := takeAll(b, p, "b", 2); len(got) > 0 {
						t.Fatalf("B was granted %d while A's 2 requests are open (limit 2); A lost %d leases", len(got), sa.LeasesLost())
					}
				}
				if lost := sa.LeasesLost(); lost != 0 {
					t.Fatalf("A lost %d leases", lost)
				}
			})
		}
	}
}

// Defect 9, Redis going down. FailLocal's twin counts the permits its
// process holds through Redis: with InFlight 3, one process under
// FailLocal(1) holding 3 through Redis takes none locally while Redis is
// paused, nor do three processes under FailLocal(1/3) holding 1 each. Before
// the fix the twin started empty: 6 open in both cases.
func TestRedisFailLocalCountsWhatItHoldsThroughRedis(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		for i, c := range []struct {
			procs int
			share float64
		}{{1, 1}, {3, 1.0 / 3}} {
			t.Run(fmt.Sprintf("%s/FailLocal(%.2g) on %d", d.name, c.share, c.procs), func(t *testing.T) {
				p := permitOf(fmt.Sprintf("tk:local%d:", i), "calls", "k", 3, 10*time.Second, nil)
				var stores []store.Backend
				var ss []*Store
				open := 0
				for j := range c.procs {
					s, b := faultStore(t, d, nil, WithFailurePolicy(FailLocal(c.share)))
					stores, ss = append(stores, b), append(ss, s)
					open += len(takeAll(b, p, fmt.Sprint("redis", j, "-"), 3/c.procs))
				}
				if open != 3 {
					t.Fatalf("%d taken through Redis, want 3", open)
				}
				srv := d.owner(permitKey(p))
				srv.Pause()
				defer srv.Resume()
				for j, b := range stores {
					before := ss[j].Degraded()
					open += len(takeAll(b, p, fmt.Sprint("local", j, "-"), 3))
					if ss[j].Degraded() == before {
						t.Fatal("the policy did not serve the takes while Redis was paused")
					}
				}
				if open > 3 {
					t.Fatalf("%d open with Redis paused, limit 3", open)
				}
			})
		}
	}
}

// The class of races between an answer from Redis and an outage, under
// FailLocal(1) with InFlight 1: a take of the process on its way to Redis
// (its script's write held back 300 ms by a slow link, Redis up, as are
// the registrations of the policy's grants: a paused Redis runs what it
// was sent in order) and a take the policy serves meanwhile (Redis judged
// down), in either order, are
// never both granted: the policy's share counts the take on its way (Redis
// may grant it), and a take that begins after the policy's grant registers
// that grant in Redis first. Before the fix the policy counted only the
// leases already held: both were granted (2 open, limit 1), which the
// random fault test found as 4 live of 3 on a loaded host.
func TestRedisFailLocalCountsTheTakesOnTheirWayToRedis(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		for _, policyFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/policy first %v", d.name, policyFirst), func(t *testing.T) {
				lag := &laggy{match: []byte(script.PermitTake.Hash()), or: []byte(script.PermitRenew.Hash()), lag: 300 * time.Millisecond}
				c := lag.client(d)
				t.Cleanup(lag.wg.Wait)
				st := New(c, WithTimeout(slowMachine), WithFailurePolicy(FailLocal(1)))
				t.Cleanup(func() { _ = st.Close() })
				f, ok := store.Of(st).(*failover)
				if !ok {
					t.Fatalf("a FailLocal store's backend is %T", store.Of(st))
				}
				p := permitOf(fmt.Sprintf("tk:onway-%v:", policyFirst), "calls", "k", 1, 10*time.Second, nil)
				if _, err := f.PermitsInUse(bg, p, 0); err != nil { // connected to the key's node, not delayed
					t.Fatal(err)
				}
				for _, s := range []*redis.Script{script.PermitTake, script.PermitRenew} {
					if err := s.Load(bg, c).Err(); err != nil {
						t.Fatal(err)
					}
				}
				served := func() store.Taken {
					f.redis.health.Down() // judged down: the take is the policy's
					before := st.Degraded()
					tk, err := f.TakePermit(bg, p, "served", 0)
					if err != nil || st.Degraded() == before {
						t.Fatalf("a take while Redis is judged down: %+v %v, not served by the policy", tk, err)
					}
					return tk
				}
				var local store.Taken
				if policyFirst {
					local = served()
					if !local.OK || !local.Lease.Local {
						t.Fatalf("the policy's take with nothing held: %+v, want a Local lease", local)
					}
					f.redis.health.Answered() // Redis answers again
				}
				type result struct {
					tk  store.Taken
					err error
				}
				done := make(chan result, 1)
				go func() {
					tk, err := f.TakePermit(bg, p, "on its way", 0)
					done <- result{tk, err}
				}()
				if !policyFirst {
					for deadline := time.Now().Add(slowMachine); ; time.Sleep(time.Millisecond) {
						f.redis.permits.leases.mu.Lock()
						n := f.redis.permits.leases.taking[permitKey(p)]
						f.redis.permits.leases.mu.Unlock()
						if n == 1 {
							break
						}
						if time.Now().After(deadline) {
							t.Fatal("the take never went to Redis")
						}
					}
					local = served()
				}
				r := <-done
				if r.err != nil {
					t.Fatalf("the take on its way to Redis: %v", r.err)
				}
				if r.tk.OK && local.OK {
					t.Fatalf("both granted, limit 1: the Redis take %+v, the policy's %+v", r.tk, local)
				}
				if !r.tk.OK && !local.OK {
					t.Fatalf("neither granted, limit 1 and nothing held: the Redis take %+v, the policy's %+v", r.tk, local)
				}
				if r.tk.OK {
					mustRelease(t, f, p, r.tk.Lease)
				}
				if local.OK {
					mustRelease(t, f, p, local.Lease)
				}
			})
		}
	}
}

// Defects 9 (Redis coming back) and 14. The permits a failure policy
// granted while Redis was down, still in use when it answers again, count
// in Redis before it grants this process anything more: with InFlight 3,
// a process given 3 by FailLocal(1) or FailOpen while Redis was paused
// gets nothing from Redis once it is back, nor does another process after
// that; each permit released frees one. Before the fix Redis granted 3
// more (6 open, Redis up).
func TestRedisPolicyGrantsStillOpenCountWhenRedisIsBack(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		for i, policy := range []FailurePolicy{FailLocal(1), FailOpen} {
			t.Run(d.name+"/"+policy.String(), func(t *testing.T) {
				s, a := faultStore(t, d, nil, WithFailurePolicy(policy))
				_, b := faultStore(t, d, nil)
				p := permitOf(fmt.Sprintf("tk:back%d:", i), "calls", "k", 3, 10*time.Second, nil)
				srv := d.owner(permitKey(p))
				srv.Pause()
				local := takeAll(a, p, "outage", 3)
				srv.Resume()
				if len(local) != 3 || s.Degraded() == 0 {
					t.Fatalf("%d granted by the policy while Redis was paused, want 3", len(local))
				}
				// Until a take of A's is answered by Redis (the policy
				// served none), it may still be judged down.
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
					before := s.Degraded()
					tk, err := a.TakePermit(bg, p, "after", 0)
					if err == nil && s.Degraded() == before {
						if tk.OK {
							t.Fatalf("Redis granted A a permit while its 3 from the outage are open: %+v (limit 3)", tk)
						}
						break
					}
					if err == nil && tk.OK {
						mustRelease(t, a, p, tk.Lease)
					}
					if time.Now().After(deadline) {
						t.Fatal("Redis never answered A again")
					}
				}
				if got := takeAll(b, p, "b", 3); len(got) != 0 {
					t.Fatalf("B was granted %d while A's 3 from the outage are open (limit 3)", len(got))
				}
				mustRelease(t, a, p, local[0])
				if got := takeAll(b, p, "b-after", 3); len(got) != 1 {
					t.Fatalf("B was granted %d after A released one of its 3, want 1", len(got))
				}
				for _, l := range local[1:] {
					mustRelease(t, a, p, l)
				}
				if n := inUse(t, b, p, 0); n != 1 {
					t.Fatalf("%d in use once A released all, want B's 1", n)
				}
			})
		}
	}
}

// Defect 11. A take that timed out behind a busy Redis is cleaned up when
// Redis answers again, under every policy: Redis stalled for 400 ms (DEBUG
// SLEEP on the node, SIGSTOP on the cluster's owner), a 100 ms timeout, 2
// permits and four callers at once; once the stall ends and the policy's
// grants are released, another process is granted 2 of 2 within 2 s (the
// lease is 10 s). Before the fix the two takes that ran after their
// callers had left were held by nobody for the whole lease: under FailOpen
// and FailLocal no clean-up was sent, under FailClosed it was refused as
// Redis was judged down; the other process got 0 of 2.
func TestRedisATakeTimedOutBehindABusyRedisIsCleanedUp(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false, "--enable-debug-command", "yes") {
		for i, policy := range []FailurePolicy{FailClosed, FailOpen, FailLocal(0.5)} {
			t.Run(d.name+"/"+policy.String(), func(t *testing.T) {
				sa, _ := faultStore(t, d, nil, WithFailurePolicy(policy))
				_, b := faultStore(t, d, nil)
				name := fmt.Sprintf("busy%d", i)
				s, err := shaper.All(sa, []shaper.Dimension{{Name: "calls", InFlight: 2}}, shaper.WithName(name))
				if err != nil {
					t.Fatal(err)
				}
				p := permitOf("tk:"+name+":", "calls", "k", 2, 10*time.Second, nil)
				srv := d.owner(permitKey(p))
				var back <-chan struct{}
				if d.name == "node" {
					back = stall(t, srv, 400*time.Millisecond)
				} else {
					srv.Pause()
					go func() { time.Sleep(400 * time.Millisecond); srv.Resume() }()
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				var granted []shaper.Reservation
				for range 4 {
					wg.Go(func() {
						if r, err := s.Reserve(bg, "k", 1); err == nil {
							mu.Lock()
							granted = append(granted, r)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				if back != nil {
					<-back
				}
				if policy == FailClosed && len(granted) > 0 {
					t.Fatalf("%d granted under FailClosed during the stall", len(granted))
				}
				for _, r := range granted { // the policy's grants, released
					if err := r.Release(bg); err != nil {
						t.Fatal(err)
					}
				}
				start := time.Now()
				for {
					got := takeAll(b, p, "b", 2)
					if len(got) == 2 {
						t.Logf("2 of 2 granted to another process %v after the stall", time.Since(start))
						break
					}
					for _, l := range got {
						mustRelease(t, b, p, l)
					}
					if time.Since(start) > 2*time.Second {
						t.Fatalf("another process gets %d of 2 two seconds after the stall: the timed-out takes' leases were never cleaned up (held: %v)", len(got), members(t, d.client(nil), p))
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	}
}

// Defect 13. Redis restarted empty (the node, without persistence; on the
// cluster the key deleted, which is what the scripts see of it) while A
// holds 2 of 2: A's renewal adds its leases back, within a renewal period
// and a retry of Redis answering, and from then on B is refused. Before
// the fix the renewal reported them lost and never added them back: B was
// granted 2 (4 open). The exception that stays, and its signal: B granted
// the permits before A's renewal added them back holds them, and A counts
// its leases lost (LeasesLost).
func TestRedisLeasesLostWithRedisStateAreAddedBack(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		t.Run(d.name, func(t *testing.T) {
			sa, a := faultStore(t, d, nil)
			_, b := faultStore(t, d, nil)
			p := permitOf("tk:empty:", "calls", "k", 2, 1500*time.Millisecond, nil)
			watch := d.client(nil)
			lose := func() {
				if d.name == "node" {
					d.owner(permitKey(p)).Restart()
				} else if err := watch.Del(bg, permitKey(p)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			held := takeAll(a, p, "a", 2)
			if len(held) != 2 {
				t.Fatal("A could not take 2 of 2")
			}
			lose()
			for deadline := time.Now().Add(3 * time.Second); watch.ZCard(bg, permitKey(p)).Val() != 2; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("A's leases were not added back: Redis holds %v, A lost %d", watch.ZRange(bg, permitKey(p), 0, -1).Val(), sa.LeasesLost())
				}
			}
			if got := takeAll(b, p, "b", 2); len(got) != 0 {
				t.Fatalf("B was granted %d after A's leases were added back", len(got))
			}
			// The exception: B asks before A's renewal.
			lose()
			var got []store.Lease
			for deadline := time.Now().Add(time.Second); len(got) == 0 && time.Now().Before(deadline); {
				got = takeAll(b, p, "b-first", 2)
			}
			for deadline := time.Now().Add(3 * time.Second); sa.LeasesLost() < uint64(len(got)); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("B was granted %d before A's renewal, and A counts %d lost", len(got), sa.LeasesLost())
				}
			}
			t.Logf("B asking at once after the state was lost was granted %d; A counts %d lost", len(got), sa.LeasesLost())
		})
	}
}

// Defect 15. A closed store refuses an in-flight take, with an error that
// matches ErrStoreUnavailable (and ErrClosed): its lease would never be
// renewed, and another process would be granted the permit a lease later
// while the call still held it. Before the fix Acquire returned nil.
func TestRedisAClosedStoreRefusesAPermit(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		t.Run(d.name, func(t *testing.T) {
			st := New(d.client(nil), WithTimeout(slowMachine))
			s, err := shaper.All(st, []shaper.Dimension{{Name: "open", InFlight: 2, Lease: time.Second}}, shaper.WithName("closed-"+d.name))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			r, err := s.Acquire(bg, "k", 1)
			if err == nil {
				_ = r.Release(bg)
				t.Fatal("Acquire on a closed store returned no error")
			}
			if !errors.Is(err, shaper.ErrStoreUnavailable) || !errors.Is(err, ErrClosed) {
				t.Fatalf("Acquire on a closed store: %v, want an error matching ErrStoreUnavailable and ErrClosed", err)
			}
			if n := inUse(t, store.Of(st), &store.Permit{Dim: &store.Dim{Name: "open", Base: "tk:closed-" + d.name + ":"}, Key: "k", Slot: "k", Limit: 2}, 0); n != 0 {
				t.Fatalf("%d leases held after the refused take", n)
			}
		})
	}
}

// Defect 16. Foreign data at an in-flight key is a *StateError the user
// sees, for the take (Reserve, Acquire) and for Status, and the key
// recovers once it is gone: a member scored 1e18 (before the fix Reserve
// failed with an *Error, "ERR value is not an integer", matching
// ErrStoreUnavailable) and one scored +inf (before the fix Status counted
// it as a permit held).
func TestRedisForeignLeasesAreAStateError(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		t.Run(d.name, func(t *testing.T) {
			c := d.client(nil)
			st := New(c, WithTimeout(slowMachine))
			t.Cleanup(func() { _ = st.Close() })
			s, err := shaper.All(st, []shaper.Dimension{{Name: "open", InFlight: 2}}, shaper.WithName("foreign-"+d.name))
			if err != nil {
				t.Fatal(err)
			}
			key := permitKey(&store.Permit{Dim: &store.Dim{Name: "open", Base: "tk:foreign-" + d.name + ":"}, Key: "k", Slot: "k"})
			for _, score := range []float64{1e18, math.Inf(1)} {
				if err := c.ZAdd(bg, key, redis.Z{Score: score, Member: "someone's"}).Err(); err != nil {
					t.Fatal(err)
				}
				var se *StateError
				r, err := s.Reserve(bg, "k", 1)
				if !errors.As(err, &se) || !errors.Is(err, shaper.ErrInvalidState) || errors.Is(err, shaper.ErrStoreUnavailable) || se.Dimension != "open" {
					_ = r.Release(bg)
					t.Fatalf("Reserve with a lease scored %g at the key: %v (%T), want a *StateError", score, err, err)
				}
				if _, err := s.Status(bg, "k", 1); !errors.As(err, &se) {
					t.Fatalf("Status with a lease scored %g at the key: %v, want a *StateError", score, err)
				}
				if m := c.ZRange(bg, key, 0, -1).Val(); len(m) != 1 || m[0] != "someone's" {
					t.Fatalf("the foreign set now holds %v", m)
				}
				if err := c.ZRem(bg, key, "someone's").Err(); err != nil {
					t.Fatal(err)
				}
				r, err = s.Reserve(bg, "k", 1)
				if err != nil {
					t.Fatalf("once the foreign lease is gone: %v", err)
				}
				if err := r.Release(bg); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// Defect 10. Takes cut short by their deadline leave no lease behind, on a
// node and on the cluster, through clients that put the deadline on the
// socket (ContextTimeoutEnabled), which closes the connection of a take
// whose reply the deadline cut: storetest.InFlightDeadlines, 8,000
// Reserves with deadlines around one round trip. Before the fix the
// clean-up release went out on another connection, unordered with the
// take, and a few leases stayed held by nobody for the lease.
func TestRedisTakesCutShortByTheirDeadlineLeaveNoLease(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		storetest.InFlightDeadlines(t, storetest.Candidate{Name: d.name, New: func() shaper.Store {
			s := New(d.client(nil), WithTimeout(slowMachine))
			t.Cleanup(func() { _ = s.Close() })
			return s
		}}, 8000)
	}
}

// Defect 10, the mechanism. A take's bytes delayed on the link (laggy:
// 30 ms) past its caller's deadline (5 ms), so that its clean-up, sent on
// another connection, reaches Redis first: 10 such Reserves leave no lease
// behind, on a node and on the cluster. Before the fix the clean-up found
// nothing to release, and each take then took a lease held by nobody for
// the whole lease (10 of 10 held).
func TestRedisATakeOvertakenByItsCleanUpLeavesNoLease(t *testing.T) {
	t.Parallel()
	for _, d := range deployments(t, false) {
		t.Run(d.name, func(t *testing.T) {
			lag := &laggy{match: []byte(script.PermitTake.Hash()), lag: 30 * time.Millisecond}
			c := lag.client(d)
			st := New(c, WithTimeout(slowMachine))
			t.Cleanup(func() { _ = st.Close() })
			s, err := shaper.All(st, []shaper.Dimension{{Name: "open", InFlight: 100}}, shaper.WithName("overtaken-"+d.name))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Status(bg, "k", 1); err != nil { // connected, and the script loaded with a take that is not delayed
				t.Fatal(err)
			}
			if err := script.PermitTake.Load(bg, c).Err(); err != nil {
				t.Fatal(err)
			}
			for range 10 {
				ctx, cancel := context.WithTimeout(bg, 5*time.Millisecond)
				if r, err := s.Reserve(ctx, "k", 1); err == nil {
					_ = r.Release(bg)
				}
				cancel()
			}
			lag.wg.Wait() // every delayed take has reached Redis
			start := time.Now()
			for {
				st, err := s.Status(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if st.Dimensions[0].InFlight == 0 {
					break
				}
				if time.Since(start) > 2*time.Second {
					t.Fatalf("%d leases held 2 s after every delayed take reached Redis (the lease is 10 s)", st.Dimensions[0].InFlight)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// The class of defects 8 to 14: whatever Redis does, permits held by live
// requests never exceed InFlight. A seeded random run per policy: 3
// processes (stores with their own clients) sharing InFlight 3 with 1 s
// leases (renewed every 200 ms), 4 workers each, each Acquire with a
// deadline that is, one time in four, around a round trip (0.2 to 2 ms),
// holding its permit 0 to 30 ms, or one time in five 0.5 to 2 s (past its
// lease: renewed through the faults); meanwhile faults follow one another:
// Redis paused (50 to 600 ms), stalled (DEBUG SLEEP 50 to 400 ms), killed
// and restarted on its AOF (down 50 to 400 ms, and its launch), one
// process cut off (50 to 600 ms), or nothing for a while. Every break is
// shorter than the lease less a period, a retry and a timeout (650 ms), so
// no exception applies: the count of live requests (taken after Acquire
// returns, given back before Release) never exceeds 3 at a grant, no lease
// is lost, and once the workers stop every permit comes back within 500 ms
// (nothing is left held by nobody: defects 10 and 11; the tolerance is for
// this host's scheduling, against a 50 ms retry and a 1 s lease). The policies: FailClosed for the fleet; FailLocal(1) for one
// process alone (its share is the whole limit: FailLocal(1/N) over N
// processes has the exception docs/INFLIGHT.md states). A failure prints
// the seed; THROTTLEKIT_SEED replays one.
func TestRedisInFlightBoundUnderRandomFaults(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("THROTTLEKIT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	for i, run := range []struct {
		name   string
		procs  int
		policy FailurePolicy
	}{{"FailClosed, 3 processes", 3, FailClosed}, {"FailLocal(1), 1 process", 1, FailLocal(1)}} {
		t.Run(run.name, func(t *testing.T) {
			t.Parallel()
			seed := seed + uint64(i)
			t.Logf("seed %d (THROTTLEKIT_SEED=%d replays the faults' choices)", seed, seed-uint64(i))
			rng := rand.New(rand.NewPCG(seed, 8))
			d := deployments(t, true, "--appendonly", "yes", "--appendfsync", "always", "--enable-debug-command", "yes")[0]
			srv := d.owner("")
			const limit = 3
			name := fmt.Sprint("random", i)
			var shapers []*shaper.Shaper
			var stores []*Store
			var cuts []*cutter
			for range run.procs {
				cut := &cutter{}
				st, _ := faultStore(t, d, cut, WithFailurePolicy(run.policy))
				s, err := shaper.All(st, []shaper.Dimension{{Name: "open", InFlight: limit, Lease: time.Second}}, shaper.WithName(name))
				if err != nil {
					t.Fatal(err)
				}
				shapers, stores, cuts = append(shapers, s), append(stores, st), append(cuts, cut)
			}
			var live, most atomic.Int64
			var over atomic.Value
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range 4 * run.procs {
				s := shapers[w%run.procs]
				wr := rand.New(rand.NewPCG(seed, uint64(100+w)))
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						deadline := 500 * time.Millisecond
						if wr.IntN(4) == 0 {
							deadline = 200*time.Microsecond + time.Duration(wr.Int64N(int64(1800*time.Microsecond)))
						}
						ctx, cancel := context.WithTimeout(bg, deadline)
						r, err := s.Acquire(ctx, "k", 1)
						cancel()
						if err != nil {
							time.Sleep(time.Millisecond)
							continue
						}
						n := live.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						if n > limit {
							over.CompareAndSwap(nil, fmt.Sprintf("%d live at a grant (limit %d)", n, limit))
						}
						hold := time.Duration(wr.IntN(30)) * time.Millisecond
						if wr.IntN(5) == 0 { // a long call: its lease must be renewed, through the faults
							hold = 500*time.Millisecond + time.Duration(wr.Int64N(int64(1500*time.Millisecond)))
						}
						time.Sleep(hold)
						live.Add(-1)
						_ = r.Release(bg)
					}
				})
			}
			var faults []string
			for end := time.Now().Add(6 * time.Second); time.Now().Before(end); {
				switch f := rng.IntN(5); f {
				case 0:
					dur := time.Duration(50+rng.IntN(551)) * time.Millisecond
					faults = append(faults, fmt.Sprint("pause ", dur))
					srv.Pause()
					time.Sleep(dur)
					srv.Resume()
				case 1:
					dur := time.Duration(50+rng.IntN(351)) * time.Millisecond
					faults = append(faults, fmt.Sprint("DEBUG SLEEP ", dur))
					<-stall(t, srv, dur)
				case 2:
					dur := time.Duration(50+rng.IntN(351)) * time.Millisecond
					faults = append(faults, fmt.Sprint("restart on AOF after ", dur))
					srv.Kill()
					time.Sleep(dur)
					srv.Restart()
				case 3:
					dur := time.Duration(50+rng.IntN(551)) * time.Millisecond
					p := rng.IntN(run.procs)
					faults = append(faults, fmt.Sprintf("cut process %d off for %v", p, dur))
					cuts[p].cut(dur)
					time.Sleep(dur)
				default:
					dur := time.Duration(100+rng.IntN(400)) * time.Millisecond
					faults = append(faults, fmt.Sprint("nothing for ", dur))
				}
				time.Sleep(time.Duration(100+rng.IntN(300)) * time.Millisecond) // recovery between faults
			}
			close(stop)
			wg.Wait()
			if v := over.Load(); v != nil {
				var lost []uint64
				for _, st := range stores {
					lost = append(lost, st.LeasesLost())
				}
				t.Fatalf("%s; leases lost per process %v; faults: %v", v, lost, faults)
			}
			for j, st := range stores {
				if lost := st.LeasesLost(); lost != 0 {
					t.Fatalf("process %d lost %d leases; faults: %v", j, lost, faults)
				}
			}
			start := time.Now()
			for {
				stat, err := shapers[0].Status(bg, "k", 1)
				if err == nil && stat.Dimensions[0].InFlight == 0 {
					break
				}
				if time.Since(start) > 500*time.Millisecond {
					t.Fatalf("500 ms after the workers stopped: %+v %v still held; faults: %v", stat.Dimensions, err, faults)
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("at most %d live of %d; faults: %v", most.Load(), limit, faults)
		})
	}
}
