package shaper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// A partner's clamp spreads what it has left evenly over its reset, in
// every process sharing the store: 5 calls left in 10 s on a contract of
// 100/s burst 10 depart 2 s apart, two processes taking turns, and the
// sixth waits for the reset, when the contract alone applies again (its
// burst); on every store.
func TestAClampSpreadsWhatIsLeftOverTheReset(t *testing.T) {
	t.Parallel()
	for kind, store := range liveStores(t) {
		t.Run(kind, func(t *testing.T) {
			clock := timer.NewFake(t0)
			process := func() *Shaper {
				s, err := New(store(), PerSecond(100).WithBurst(10), WithClock(clock), WithName("clamp-"+kind), WithMaxQueue(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			a, b := process(), process()
			if err := a.Clamp(bg, "k", 5, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			var got []time.Duration
			for i := range 8 {
				s := a
				if i%2 == 1 {
					s = b
				}
				got = append(got, mustReserve(t, s, "k", 1).Delay)
			}
			want := "[0s 2s 4s 6s 8s 10s 10s 10s]"
			if fmt.Sprint(got) != want {
				t.Fatalf("delays %v, want %s", got, want)
			}
			if d := mustReserve(t, a, "other", 1).Delay; d != 0 {
				t.Fatalf("a key without a clamp waits %v", d)
			}
			st, err := b.Status(bg, "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			if st.Next.Sub(clock.Now()) != 10*time.Second {
				t.Fatalf("Status under the clamp: next in %v, want the reset's 10s", st.Next.Sub(clock.Now()))
			}
			clock.Advance(11 * time.Second) // the window is over: the contract alone
			if d := mustReserve(t, b, "k", 1).Delay; d != 0 {
				t.Fatalf("after the reset a request waits %v", d)
			}
		})
	}
}

// A clamp only ever slows a key: one that allows what the contract would
// send anyway records nothing, a clamp never lets a request leave sooner
// than the contract does, none left pauses until the reset, and Reset
// forgets it; bad input is refused with a typed error.
func TestAClampOnlySlowsAKey(t *testing.T) {
	t.Parallel()
	for kind, store := range liveStores(t) {
		t.Run(kind, func(t *testing.T) {
			clock := timer.NewFake(t0)
			s, err := New(store(), PerSecond(2), WithClock(clock), WithName("clamp-slows-"+kind), WithMaxQueue(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Clamp(bg, "loose", 100, 10*time.Second); err != nil { // the contract sends at most 21 in 10 s
				t.Fatal(err)
			}
			got := departures(t, s, "loose", 3)
			if fmt.Sprint(got) != "[0s 500ms 1s]" {
				t.Fatalf("under a loose clamp: %v, want the contract's pace", got)
			}
			if err := s.Clamp(bg, "tight", 4, 4*time.Second); err != nil { // 1 s apart: slower than 2/s
				t.Fatal(err)
			}
			if got := departures(t, s, "tight", 3); fmt.Sprint(got) != "[0s 1s 2s]" {
				t.Fatalf("under a clamp of 4 in 4 s: %v", got)
			}
			if err := s.Clamp(bg, "none", 0, 3*time.Second); err != nil {
				t.Fatal(err)
			}
			if d := mustReserve(t, s, "none", 1).Delay; d != 3*time.Second {
				t.Fatalf("none left: %v, want the 3 s reset", d)
			}
			if err := s.Reset(bg, "tight"); err != nil {
				t.Fatal(err)
			}
			if d := mustReserve(t, s, "tight", 1).Delay; d != 0 {
				t.Fatalf("after Reset: %v", d)
			}
			var ce *ConfigError
			if err := s.Clamp(bg, "k", 1, MaxPause+time.Hour); !errors.As(err, &ce) {
				t.Fatalf("a reset past MaxPause: %v", err)
			}
			if err := s.Clamp(bg, string(make([]byte, MaxKeyLen+1)), 1, time.Second); !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("a key too long: %v", err)
			}
			if err := (*Shaper)(nil).Clamp(bg, "k", 1, time.Second); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("a nil shaper: %v", err)
			}
		})
	}
}

// A clamp key holding what the library did not write fails the calls on
// that key alone with a *redisstore.StateError (a value of another type: Clamp, and
// the reservations of several dimensions) and is never overwritten, on a
// node and on the cluster, for one contract and for several.
func TestRedisAForeignClampKeyFailsThatCallAlone(t *testing.T) {
	t.Parallel()
	node, cluster := nodeAndCluster(t)
	for kind, c := range map[string]interface {
		Set(ctx context.Context, key string, value any, expiration time.Duration) *redis.StatusCmd
		RPush(ctx context.Context, key string, values ...any) *redis.IntCmd
		Get(ctx context.Context, key string) *redis.StringCmd
		LLen(ctx context.Context, key string) *redis.IntCmd
	}{"redis": node, "cluster": cluster} {
		store := redisstore.New(c.(redis.UniversalClient), redisstore.WithTimeout(slowMachine), redisstore.WithFailurePolicy(redisstore.FailOpen))
		one, err := New(store, PerSecond(10), WithName("clamp-foreign-"+kind))
		if err != nil {
			t.Fatal(err)
		}
		multi, err := All(store, []Dimension{
			{Name: "requests", Rate: PerSecond(10), Cost: func(int64) int64 { return 1 }},
			{Name: "tokens", Rate: PerSecond(1000).WithBurst(1000)},
		}, WithName("clamp-foreign-all-"+kind))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*Shaper{one, multi} {
			if err := c.Set(bg, stateKey(s, "corrupt")+":k", "not a clamp", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.RPush(bg, stateKey(s, "list")+":k", "a").Err(); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"corrupt", "list"} {
				for name, op := range map[string]func() error{
					"reserve": func() error { _, err := s.Reserve(bg, key, 1); return err },
					"status":  func() error { _, err := s.Status(bg, key, 1); return err },
					"clamp":   func() error { return s.Clamp(bg, key, 1, time.Minute) },
				} {
					err := op()
					if key == "list" && name != "clamp" && err == nil {
						// A reservation of one contract reads its keys with one
						// MGET, which reads a key of another type as none, as
						// it does a pause key: ignored, never overwritten.
						continue
					}
					if !errors.Is(err, ErrInvalidState) {
						t.Fatalf("%s %s %q: %v, want ErrInvalidState", kind, name, key, err)
					}
				}
			}
			if got, _ := c.Get(bg, stateKey(s, "corrupt")+":k").Result(); got != "not a clamp" {
				t.Fatalf("%s: the foreign clamp key now holds %q", kind, got)
			}
			if n, _ := c.LLen(bg, stateKey(s, "list")+":k").Result(); n != 1 {
				t.Fatalf("%s: the foreign list was changed", kind)
			}
			if _, err := s.Reserve(bg, "innocent", 1); err != nil {
				t.Fatalf("%s: an innocent key: %v", kind, err)
			}
		}
		if store.Degraded() != 0 {
			t.Fatalf("%s: data errors were served by the policy", kind)
		}
		_ = store.Close()
	}
}

// A Wait on a Redis store whose slot falls before its context's deadline
// departs on it, however near the deadline is to the slot. Before the fix
// the check made pauseLead before the slot (see sleepChecking) compared
// the whole delay, counted from the grant, with the time left then: a 1 s
// wait with a deadline 0.3 s after its slot failed with a *DeadlineError
// and gave its slot back. The fleet's clamp test found it: every process
// dropped the clamped slots near the end of its run.
func TestRedisWaitDepartsOnASlotBeforeItsDeadline(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	s, err := New(redisstore.New(c, redisstore.WithTimeout(slowMachine)), PerSecond(1), WithName("wait-deadline"))
	if err != nil {
		t.Fatal(err)
	}
	first := mustReserve(t, s, "k", 1)
	// The second slot is 1 s after the first; the deadline 1.3 s after it
	// leaves 300 ms of slack for a loaded machine.
	ctx, cancel := context.WithDeadline(bg, time.Now().Add(first.Delay+1300*time.Millisecond))
	defer cancel()
	start := time.Now()
	if err := s.Wait(ctx, "k", 1); err != nil {
		t.Fatalf("Wait for a slot about 1 s away, deadline 1.3 s away: %v", err)
	}
	if waited := time.Since(start); waited < 900*time.Millisecond {
		t.Fatalf("departed after %v, before its slot", waited)
	}
}

// clampStores returns, per store kind, a maker of a fresh store: memory,
// and a Redis node on the shaper's clock (timeless: TTLs in simulated ms).
func clampStores(t *testing.T) map[string]func() Store {
	t.Helper()
	_, node := redisClient(t)
	client := timeless(node)
	return map[string]func() Store{
		"memory": func() Store {
			m := memstore.New(memstore.WithSweepInterval(0))
			t.Cleanup(func() { _ = m.Close() })
			return m
		},
		"redis": func() Store {
			return redisstore.New(client, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
		},
	}
}

// admittedAtOnce counts the requests of cost 1 that Allow admits on key one
// after another at the clock's instant (it consumes them).
func admittedAtOnce(t *testing.T, s *Shaper, key string) int64 {
	t.Helper()
	n := int64(0)
	for ; n < 100; n++ {
		ok, err := s.Allow(bg, key, 1)
		if err != nil {
			t.Fatalf("Allow(%q): %v", key, err)
		}
		if !ok {
			break
		}
	}
	return n
}

// Right after Clamp(5, 10 s) at 20/s burst 4 only one request departs at
// once, and Status says so: Remaining 1, not the contract's 4 (issue item
// 13); once it has left, 0 and the next slot 2 s on, as for a pause; then
// 1 again at that slot; the key is not cold before the clamp's reset, and
// after it the contract alone counts. The leaky bucket, GCRA and the token
// bucket, on memory and on a Redis node.
func TestStatusUnderAClampSaysWhatDepartsAtOnce(t *testing.T) {
	t.Parallel()
	stores := clampStores(t)
	for _, alg := range []struct {
		name string
		alg  Algorithm
	}{{"leaky", LeakyBucket}, {"gcra", GCRA}, {"token", TokenBucket}} {
		for kind, store := range stores {
			t.Run(alg.name+"/"+kind, func(t *testing.T) {
				clock := timer.NewFake(t0)
				s, err := New(store(), PerSecond(20).WithBurst(4), WithClock(clock), WithAlgorithm(alg.alg), WithPrefix("clamp-status-"+alg.name+":"))
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Clamp(bg, "k", 5, 10*time.Second); err != nil {
					t.Fatal(err)
				}
				start := clock.Now()
				st, err := s.Status(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if got := admittedAtOnce(t, s, "k"); st.Remaining != got || got != 1 {
					t.Fatalf("right after the clamp Status says %d remain, Allow admits %d at once (want 1): %s", st.Remaining, got, statusText(st, start))
				}
				if !st.Next.Equal(start) || !st.PausedUntil.IsZero() || st.Binding != "" || st.ResetAt.Before(start.Add(10*time.Second)) {
					t.Fatalf("right after the clamp: %s, paused until %v", statusText(st, start), st.PausedUntil)
				}
				st, err = s.Status(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				slot := start.Add(2 * time.Second)
				if st.Remaining != 0 || st.Binding != "pause" || !st.Next.Equal(slot) || !st.PausedUntil.Equal(slot) {
					t.Fatalf("once the slot is taken: %s, paused until +%v", statusText(st, start), st.PausedUntil.Sub(start))
				}
				clock.Advance(2 * time.Second)
				st, err = s.Status(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if got := admittedAtOnce(t, s, "k"); st.Remaining != got || got != 1 {
					t.Fatalf("at the next slot Status says %d remain, Allow admits %d at once (want 1)", st.Remaining, got)
				}
				clock.Advance(8 * time.Second) // the reset: the contract alone
				st, err = s.Status(bg, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if got := admittedAtOnce(t, s, "k"); st.Remaining != got || got != 4 {
					t.Fatalf("after the reset Status says %d remain, Allow admits %d at once (want the burst, 4)", st.Remaining, got)
				}
			})
		}
	}
}

// Status tells what the next calls would get: at seeded random instants,
// among random clamps, pauses, reservations and admissions, Status(key,
// 1).Remaining is the number of requests of cost 1 that Allow admits one
// after another at that instant. Shapers of one contract (the leaky
// bucket, GCRA, the token bucket) and of two dimensions whose account
// dimension is shared by keys (All and Any, so that a clamp on one key
// holds the others' account), on memory and on a Redis node.
func TestStatusRemainingIsWhatAllowAdmitsAtOnce(t *testing.T) {
	t.Parallel()
	account := func(key string) string { return "acct:" + key[:1] }
	two := func(any bool) func(Store, Clock, string) (*Shaper, error) {
		return func(store Store, clock Clock, prefix string) (*Shaper, error) {
			dims := []Dimension{
				{Name: "account", Rate: PerSecond(8).WithBurst(3), Key: account},
				{Name: "own", Rate: PerSecond(20).WithBurst(4)},
			}
			if any {
				return Any(store, dims, WithClock(clock), WithPrefix(prefix))
			}
			return All(store, dims, WithClock(clock), WithPrefix(prefix))
		}
	}
	one := func(alg Algorithm) func(Store, Clock, string) (*Shaper, error) {
		return func(store Store, clock Clock, prefix string) (*Shaper, error) {
			return New(store, PerSecond(20).WithBurst(4), WithClock(clock), WithAlgorithm(alg), WithPrefix(prefix))
		}
	}
	shapers := []struct {
		name string
		make func(Store, Clock, string) (*Shaper, error)
	}{{"leaky", one(LeakyBucket)}, {"gcra", one(GCRA)}, {"token", one(TokenBucket)}, {"all", two(false)}, {"any", two(true)}}
	keys := []string{"a1", "a2", "b1"}
	stores := clampStores(t)
	for seed, sh := range shapers {
		for kind, store := range stores {
			t.Run(sh.name+"/"+kind, func(t *testing.T) {
				clock := timer.NewFake(t0)
				s, err := sh.make(store(), clock, "clamp-prop-"+sh.name+":")
				if err != nil {
					t.Fatal(err)
				}
				watchClamps(s) // clampHolds reads the clamps it sets
				rng := rand.New(rand.NewPCG(uint64(seed), 13))
				var log []string
				checked, clamped := 0, 0
				for i := range 400 {
					key := keys[rng.IntN(len(keys))]
					switch op := rng.IntN(20); {
					case op < 7:
						st, err := s.Status(bg, key, 1)
						if err != nil {
							t.Fatal(err)
						}
						held := clampHolds(t, s, key)
						got := admittedAtOnce(t, s, key)
						log = append(log, fmt.Sprintf("%d status %q: %s held %v, admitted %d", i, key, statusText(st, clock.Now()), held, got))
						if st.Remaining != got {
							t.Fatalf("step %d: Status(%q, 1) says %d remain, Allow admits %d at once\n%s", i, key, st.Remaining, got, tail(log, 12))
						}
						checked++
						if held {
							clamped++
						}
					case op < 10:
						n, reset := int64(rng.IntN(7)), time.Duration(rng.IntN(3000))*time.Millisecond
						if err := s.Clamp(bg, key, n, reset); err != nil {
							t.Fatal(err)
						}
						log = append(log, fmt.Sprintf("%d clamp %q %d in %v", i, key, n, reset))
					case op < 11:
						d := time.Duration(rng.IntN(800)) * time.Millisecond
						if err := s.Pause(bg, key, d); err != nil {
							t.Fatal(err)
						}
						log = append(log, fmt.Sprintf("%d pause %q %v", i, key, d))
					case op < 14:
						cost := int64(1 + rng.IntN(2))
						r, err := s.Reserve(bg, key, cost)
						log = append(log, fmt.Sprintf("%d reserve %q %d: %v %v", i, key, cost, r.Delay, errText(err)))
					case op < 15:
						ok, err := s.Allow(bg, key, 1)
						if err != nil {
							t.Fatal(err)
						}
						log = append(log, fmt.Sprintf("%d allow %q: %v", i, key, ok))
					default:
						d := time.Duration(rng.IntN(400)) * time.Millisecond
						clock.Advance(d)
						log = append(log, fmt.Sprintf("%d advance %v", i, d))
					}
				}
				if checked < 50 || clamped < 10 {
					t.Fatalf("the walk checked %d instants, %d under a clamp: too few", checked, clamped)
				}
			})
		}
	}
}

// tail returns the last n lines of log, one a line.
func tail(log []string, n int) string {
	out := ""
	for _, l := range log[max(0, len(log)-n):] {
		out += l + "\n"
	}
	return out
}
