package redisstore

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// 8 separate clients x 50 goroutines on one key with limit K: exactly K are
// admitted for GCRA, the fixed window and the sliding log; the leaky bucket
// hands every request a distinct slot, exactly T apart.
func TestRedisAtomicityAcrossClients(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	const K, clients, goroutines = 100, 8, 50
	for _, alg := range []shaper.Algorithm{shaper.GCRA, shaper.FixedWindow, shaper.SlidingWindowLog, shaper.LeakyBucket} {
		rate := shaper.PerHour(K).WithBurst(K)
		if alg == shaper.LeakyBucket {
			rate = shaper.PerSecond(1000)
		}
		var shapers []*shaper.Shaper
		for range clients {
			store, _ := newSpied(srv.Client(), WithTimeout(slowMachine))
			s, err := shaper.New(store, rate, shaper.WithAlgorithm(alg), shaper.WithName("atomic-"+alg.String()), shaper.WithMaxQueue(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			shapers = append(shapers, s)
		}
		var admitted atomic.Int64
		var mu sync.Mutex
		var tags []float64
		var wg sync.WaitGroup
		for c := range clients {
			for range goroutines {
				wg.Go(func() {
					var g grant
					_, err := shapers[c].Reserve(withGrant(bg, &g), "one-key", 1)
					if err == nil {
						admitted.Add(1)
						mu.Lock()
						tags = append(tags, g.tag)
						mu.Unlock()
					} else if !errors.Is(err, shaper.ErrQueueFull) {
						t.Error(err)
					}
				})
			}
		}
		wg.Wait()
		if alg != shaper.LeakyBucket {
			if admitted.Load() != K {
				t.Fatalf("%v: %d admitted, want exactly %d", alg, admitted.Load(), K)
			}
			continue
		}
		if admitted.Load() != clients*goroutines {
			t.Fatalf("leaky bucket: %d of %d got a slot", admitted.Load(), clients*goroutines)
		}
		slices.Sort(tags)
		for i := 1; i < len(tags); i++ {
			if gap := tags[i] - tags[i-1]; gap < 1-1e-6 {
				t.Fatalf("slots %d and %d are %v ms apart, want 1 ms (T)", i-1, i, gap)
			}
		}
	}
}

var evalsha = regexp.MustCompile(`cmdstat_(evalsha|eval):calls=(\d+)`)

func scriptCalls(t *testing.T, c *redis.Client) (evalshaN, evalN int) {
	t.Helper()
	info, err := c.Info(bg, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range evalsha.FindAllStringSubmatch(info, -1) {
		n, _ := strconv.Atoi(m[2])
		if m[1] == "evalsha" {
			evalshaN = n
		} else {
			evalN = n
		}
	}
	return evalshaN, evalN
}

// One round trip per reservation: one EVALSHA each, measured by the server;
// after SCRIPT FLUSH the next call reloads the script (EVAL) and succeeds.
func TestRedisOneRoundTripAndScriptFlush(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	// No contract reads (one EVALSHA a second, in the background): only
	// the reservations' calls are counted.
	s, err := shaper.New(New(c, WithTimeout(slowMachine)), shaper.PerSecond(1000), shaper.WithMaxQueue(time.Minute), shaper.WithContractRefresh(0))
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "warm", 1) // loads the script
	sha0, eval0 := scriptCalls(t, c)
	for i := range 100 {
		mustReserve(t, s, "k"+strconv.Itoa(i%7), 1)
	}
	sha1, eval1 := scriptCalls(t, c)
	if sha1-sha0 != 100 || eval1 != eval0 {
		t.Fatalf("100 reservations ran %d EVALSHA and %d EVAL, want 100 and 0", sha1-sha0, eval1-eval0)
	}
	if err := c.ScriptFlush(bg).Err(); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "after-flush", 1)
	if _, eval2 := scriptCalls(t, c); eval2 != eval1+1 {
		t.Fatalf("after SCRIPT FLUSH: %d EVAL, want one reload", eval2-eval1)
	}
}

// Idle keys disappear: every key's TTL ends when its state is equivalent to a
// cold key.
func TestRedisKeysExpireWhenIdle(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	s, err := shaper.New(New(c, WithTimeout(slowMachine)), shaper.PerSecond(20), shaper.WithName("ttl")) // T = 50 ms
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "k", 1)
	_ = s.Pause(bg, "k", 80*time.Millisecond)
	key := keysOf(s.Name(), []string{""}, []string{"k"}, "k")
	for i, want := range []time.Duration{50 * time.Millisecond, 80 * time.Millisecond} {
		ttl, err := c.PTTL(bg, key[i]).Result()
		if err != nil || ttl <= 0 || ttl > want {
			t.Fatalf("PTTL %s = %v, %v; want (0, %v]", key[i], ttl, err, want)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if n, _ := c.Exists(bg, key...).Result(); n != 0 {
		t.Fatalf("%d keys still exist after going idle", n)
	}
	q, _ := shaper.New(New(c, WithTimeout(slowMachine)), shaper.PerSecond(5), shaper.WithAlgorithm(shaper.Quota(shaper.Daily(0))), shaper.WithName("q"))
	mustReserve(t, q, "k", 1)
	ttl, _ := c.PTTL(bg, stateKey(q, "", "k")).Result()
	if end := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); ttl < end-time.Second || ttl > end+time.Second {
		t.Fatalf("daily quota key PTTL %v, want the time to midnight UTC (%v)", ttl, end)
	}
}

// Two processes whose clocks disagree by 4 s share one schedule: Redis TIME
// decides, so their slots on one key are exactly T apart.
func TestRedisServerClockSharedAcrossSkewedHosts(t *testing.T) {
	t.Parallel()
	srv, _ := redisClient(t)
	ahead, behind := timer.NewFake(time.Now().Add(2*time.Second)), timer.NewFake(time.Now().Add(-2*time.Second))
	// 10/s: 40 reservations queue 4 s ahead, so the key never goes idle
	// between calls however slowly the test runs.
	storeA, _ := newSpied(srv.Client(), WithTimeout(slowMachine))
	a, err := shaper.New(storeA, shaper.PerSecond(10), shaper.WithClock(ahead), shaper.WithName("skew"))
	if err != nil {
		t.Fatal(err)
	}
	storeB, _ := newSpied(srv.Client(), WithTimeout(slowMachine))
	b, err := shaper.New(storeB, shaper.PerSecond(10), shaper.WithClock(behind), shaper.WithName("skew"))
	if err != nil {
		t.Fatal(err)
	}
	var tags []float64
	for i := range 40 {
		s := a
		if i%2 == 1 {
			s = b
		}
		_, g := reserveGrant(t, s, "k", 1)
		tags = append(tags, g.tag)
	}
	for i := 1; i < len(tags); i++ {
		if gap := tags[i] - tags[i-1]; gap != 100 {
			t.Fatalf("slots %d and %d are %v ms apart, want exactly 100 (T at 10/s)", i-1, i, gap)
		}
	}
}

// recover polls until a reservation is served by Redis again and returns how
// long that took.
func recoverTime(t *testing.T, store *Store, s *shaper.Shaper) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		before := store.Degraded()
		_, err := s.Reserve(bg, "probe", 1)
		if err == nil && store.Degraded() == before {
			return time.Since(start)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("Redis came back but the store did not use it within 5 s")
	return 0
}

// The failure policies against a real server stopped with SIGSTOP, then
// killed: FailClosed errors within the per-call timeout, FailOpen admits,
// FailLocal paces locally; shared shaping resumes within a second of Redis
// coming back.
func TestRedisFailurePolicies(t *testing.T) {
	srv, _ := redisClient(t)
	client := func() *redis.Client {
		return srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 })
	}
	newShaper := func(p FailurePolicy) (*shaper.Shaper, *Store) {
		store := New(client(), WithTimeout(100*time.Millisecond), WithFailurePolicy(p))
		t.Cleanup(func() { _ = store.Close() })
		s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithName("fail"), shaper.WithMaxQueue(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return s, store
	}
	closed, closedStore := newShaper(FailClosed)
	open, openStore := newShaper(FailOpen)
	local, localStore := newShaper(FailLocal(0.5))
	for _, s := range []*shaper.Shaper{closed, open, local} {
		mustReserve(t, s, "k", 1)
	}
	for _, outage := range []string{"paused", "killed"} {
		if outage == "paused" {
			srv.Pause()
		} else {
			srv.Kill()
		}
		start := time.Now()
		_, err := closed.Reserve(bg, "k", 1)
		if !errors.Is(err, shaper.ErrStoreUnavailable) {
			t.Fatalf("%s: FailClosed returned %v", outage, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Fatalf("%s: FailClosed took %v to fail, per-call timeout 100ms", outage, took)
		}
		if _, err := closed.Reserve(bg, "k", 1); !errors.Is(err, shaper.ErrStoreUnavailable) {
			t.Fatalf("%s: second FailClosed call: %v", outage, err)
		}
		for range 5 {
			if r, err := open.Reserve(bg, "k", 1); err != nil || r.Delay != 0 {
				t.Fatalf("%s: FailOpen: %v %v", outage, r.Delay, err)
			}
		}
		if openStore.Degraded() == 0 {
			t.Fatalf("%s: FailOpen did not count its degraded answers", outage)
		}
		began := time.Now()
		r1 := mustReserve(t, local, "fresh-"+outage, 1)
		between := time.Now()
		r2 := mustReserve(t, local, "fresh-"+outage, 1)
		d1, d2 := between.Sub(began), time.Since(between)
		// Compare departure instants: the first call read the clock before its
		// Redis call timed out, so the delays are measured from different nows.
		// A local grant's delay counts from a clock reading taken once the
		// store has answered, after the twin decided: each slot may read late
		// by up to its own call's duration (under load, milliseconds).
		if gap := r2.Time().Sub(r1.Time()); gap < 199*time.Millisecond-d1 || gap > 201*time.Millisecond+d2 {
			t.Fatalf("%s: FailLocal(0.5) slots %v apart, want 200ms (half of 10/s; calls took %v and %v)", outage, gap, d1, d2)
		}
		// Status: FailLocal reads what it grants (its next slot 200 ms after
		// r2's, counted from one clock reading: within 2 ms); the others
		// have no shared figure to give.
		st, err := local.Status(bg, "fresh-"+outage, 1)
		if err != nil {
			t.Fatalf("%s: FailLocal Status: %v", outage, err)
		}
		if gap := st.Next.Sub(r2.Time()); gap < 198*time.Millisecond || gap > 202*time.Millisecond {
			t.Fatalf("%s: FailLocal Status says the next slot is %v after the last, want 200ms", outage, gap)
		}
		for name, s := range map[string]*shaper.Shaper{"FailClosed": closed, "FailOpen": open} {
			if _, err := s.Status(bg, "k", 1); !errors.Is(err, shaper.ErrStoreUnavailable) {
				t.Fatalf("%s: %s Status: %v, want an *Error", outage, name, err)
			}
		}
		if outage == "paused" {
			srv.Resume()
		} else {
			srv.Restart()
		}
		for name, pair := range map[string]struct {
			s     *shaper.Shaper
			store *Store
		}{"FailClosed": {closed, closedStore}, "FailOpen": {open, openStore}, "FailLocal": {local, localStore}} {
			if took := recoverTime(t, pair.store, pair.s); took > time.Second+200*time.Millisecond {
				t.Fatalf("%s after Redis %s: shared shaping resumed after %v, want within a second", name, outage, took)
			} else {
				t.Logf("%s after Redis was %s: shared shaping resumed after %v", name, outage, took.Round(time.Millisecond))
			}
		}
	}
}

// A caller whose ctx ends during a Redis call gets ctx.Err() unchanged, not a
// store error, and the store does not count Redis as down for it.
func TestRedisCallerContextErrorsAreUnchanged(t *testing.T) {
	srv, _ := redisClient(t)
	store := New(srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true; o.MaxRetries = -1 }), WithTimeout(5*time.Second))
	s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithName("ctx"))
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "k", 1)
	srv.Pause()
	defer srv.Resume()
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	if _, err := s.Reserve(ctx, "k", 1); err != context.DeadlineExceeded {
		t.Fatalf("deadline during the call: %v, want context.DeadlineExceeded unchanged", err)
	}
	cctx, ccancel := context.WithCancel(bg)
	time.AfterFunc(50*time.Millisecond, ccancel)
	if err := s.Pause(cctx, "k", time.Second); err != context.Canceled {
		t.Fatalf("cancel during Pause: %v, want context.Canceled unchanged", err)
	}
	if !store.r.health.IsUp() {
		t.Fatal("the caller's own deadline marked Redis as down")
	}
}
