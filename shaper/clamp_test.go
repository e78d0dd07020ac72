package shaper

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/timer"
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
// that key alone with a *StateError (a value of another type: Clamp, and
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
		store := NewRedisStore(c.(redis.UniversalClient), WithRedisTimeout(slowMachine), WithFailurePolicy(FailOpen))
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
	s, err := New(NewRedisStore(c, WithRedisTimeout(slowMachine)), PerSecond(1), WithName("wait-deadline"))
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
