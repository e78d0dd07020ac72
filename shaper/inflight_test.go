package shaper

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/conform"
	"github.com/throttlekit/throttlekit-go/memstore"
)

// newFlightShaper returns a shaper of dims on a fresh memory store, on the
// system clock (inside a synctest bubble: the bubble's).
func newFlightShaper(t testing.TB, dims ...Dimension) *Shaper {
	t.Helper()
	s, err := All(memstore.New(memstore.WithSweepInterval(0)), dims)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// inFlight reads the permits held on key.
func inFlight(t testing.TB, s *Shaper, key string) (held int64, waiting int) {
	t.Helper()
	st, err := s.Status(bg, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range st.Dimensions {
		if d.Name == s.flight.dim.Name {
			return d.InFlight, d.Waiting
		}
	}
	t.Fatalf("no in-flight dimension in %+v", st)
	return 0, 0
}

// A permit is held until released, by exactly one release however many
// copies of the reservation release; Reserve never waits for one.
func TestInFlightPermitsAreHeldUntilReleasedOnce(t *testing.T) {
	s := newFlightShaper(t, Dimension{Name: "open", InFlight: 3})
	var held []Reservation
	for range 3 {
		r, err := s.Reserve(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	_, err := s.Reserve(bg, "k", 1)
	var qf *QueueFullError
	if !errors.As(err, &qf) || !qf.InFlight || qf.Dimension != "open" || !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a fourth Reserve: %v, want a *QueueFullError naming the in-flight dimension", err)
	}
	if n, _ := inFlight(t, s, "k"); n != 3 {
		t.Fatalf("in flight %d, want 3", n)
	}
	copyOf := held[0]
	if err := held[0].Release(bg); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the copy, and the original again: nothing more is freed
		if err := copyOf.Release(bg); err != nil {
			t.Fatal(err)
		}
		if err := held[0].Release(bg); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := inFlight(t, s, "k"); n != 2 {
		t.Fatalf("in flight %d after one reservation released by it and its copy, want 2", n)
	}
	if _, err := s.Reserve(bg, "other", 1); err != nil { // keys do not share permits
		t.Fatal(err)
	}
	for _, r := range held {
		_ = r.Release(bg)
	}
	if n, _ := inFlight(t, s, "k"); n != 0 {
		t.Fatalf("in flight %d after every release, want 0", n)
	}
	if len(s.flight.rooms) != 0 {
		t.Fatalf("%d rooms left open", len(s.flight.rooms))
	}
}

// Waiters of one process are served in arrival order, each woken by a
// release; a waiter that leaves (its ctx ends) gives its turn on.
func TestInFlightWaitersAreServedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{Name: "open", InFlight: 1})
		first, err := s.Acquire(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []int
		got := make(chan Reservation, 8)
		ctxs := make([]context.CancelFunc, 6)
		for i := range 6 {
			ctx, cancel := context.WithCancel(bg)
			ctxs[i] = cancel
			go func() {
				r, err := s.Acquire(ctx, "k", 1)
				if err != nil {
					if i != 2 || !errors.Is(err, context.Canceled) {
						t.Errorf("waiter %d: %v", i, err)
					}
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				got <- r
			}()
			synctest.Wait() // waiter i is in the room before i+1 arrives
		}
		if _, w := inFlight(t, s, "k"); w != 6 {
			t.Fatalf("%d waiting, want 6", w)
		}
		ctxs[2]()
		synctest.Wait()
		prev := first
		for range 5 {
			if err := prev.Release(bg); err != nil {
				t.Fatal(err)
			}
			prev = <-got
		}
		_ = prev.Release(bg)
		for _, c := range ctxs {
			c()
		}
		if want := []int{0, 1, 3, 4, 5}; !equalInts(order, want) {
			t.Fatalf("served in order %v, want %v", order, want)
		}
	})
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The waiting room of a key is bounded: past MaxWaiting, Acquire is
// refused at once with the in-flight dimension named, and nothing is taken.
func TestInFlightWaitingRoomIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{Name: "open", InFlight: 1, MaxWaiting: 2}, Dimension{Name: "rate", Rate: PerSecond(100)})
		r, err := s.Acquire(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if _, err := s.Acquire(ctx, "k", 1); !errors.Is(err, context.Canceled) {
					t.Errorf("a waiter: %v, want context.Canceled", err)
				}
			})
		}
		synctest.Wait()
		_, err = s.Acquire(bg, "k", 1)
		var qf *QueueFullError
		if !errors.As(err, &qf) || !qf.InFlight || qf.Dimension != "open" {
			t.Fatalf("a third waiter: %v, want a *QueueFullError for the in-flight dimension", err)
		}
		cancel()
		wg.Wait()
		if n, w := inFlight(t, s, "k"); n != 1 || w != 0 {
			t.Fatalf("in flight %d, waiting %d; want 1 and 0", n, w)
		}
		_ = r.Release(bg)
	})
}

// While a request waits for a permit it holds nothing of the rate: the
// rate dimension's standing is what the holders left it.
func TestInFlightWaitersHoldNoRateSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{Name: "open", InFlight: 1}, Dimension{Name: "rate", Rate: PerSecond(10).WithBurst(5)})
		r, err := s.Acquire(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg)
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { _, _ = s.Acquire(ctx, "k", 1) })
		}
		synctest.Wait()
		st, err := s.Status(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if st.Binding != "open" || st.Remaining != 0 {
			t.Fatalf("binding %q remaining %d, want the in-flight dimension with none left", st.Binding, st.Remaining)
		}
		for _, d := range st.Dimensions {
			if d.Name == "rate" && d.Remaining != 4 {
				t.Fatalf("the rate has %d left with 3 waiting for a permit, want 4 (the holder's slot alone)", d.Remaining)
			}
		}
		cancel()
		wg.Wait()
		_ = r.Release(bg)
	})
}

// A permit taken for a request that then gets no slot is given back: a
// rate refusal, a deadline, a cancelled sleep, a cancel before the slot.
func TestInFlightPermitComesBackWhenNoSlotIsGranted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{Name: "open", InFlight: 5}, Dimension{Name: "rate", Rate: PerSecond(1)})
		first, err := s.Reserve(bg, "k", 1) // the slot now; the next is 1 s away
		if err != nil {
			t.Fatal(err)
		}
		dl, cancel := context.WithTimeout(bg, 500*time.Millisecond)
		defer cancel()
		var de *DeadlineError
		if _, err := s.Acquire(dl, "k", 1); !errors.As(err, &de) {
			t.Fatalf("Acquire past its deadline: %v, want a *DeadlineError", err)
		}
		if _, err := s.Reserve(bg, "k", 1<<40); !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("a cost never admissible: %v", err)
		}
		ctx, stop := context.WithCancel(bg)
		done := make(chan error)
		go func() { _, err := s.Acquire(ctx, "k", 1); done <- err }()
		synctest.Wait()
		if n, _ := inFlight(t, s, "k"); n != 2 {
			t.Fatalf("in flight %d while one sleeps to its slot, want 2 (it holds its permit from its grant)", n)
		}
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		r, err := s.Reserve(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Cancel(bg); err != nil {
			t.Fatal(err)
		}
		if n, _ := inFlight(t, s, "k"); n != 1 {
			t.Fatalf("in flight %d, want 1 (the first reservation's alone)", n)
		}
		_ = first.Release(bg)
	})
}

// Wait and Allow could not release a permit: they are refused with a
// *ConfigError, and so are in-flight dimensions configured wrongly.
func TestInFlightConfiguration(t *testing.T) {
	s := newFlightShaper(t, Dimension{InFlight: 2})
	if err := s.Wait(bg, "k", 1); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Wait: %v", err)
	}
	if _, err := s.Allow(bg, "k", 1); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Allow: %v", err)
	}
	if !s.HoldsPermits("k") || !Route(func(string) Reserver { return s }).(PermitHolder).HoldsPermits("k") {
		t.Fatal("HoldsPermits: false")
	}
	for name, dims := range map[string][]Dimension{
		"two in-flight":   {{Name: "a", InFlight: 1}, {Name: "b", InFlight: 1}},
		"rate and limit":  {{Name: "a", InFlight: 1, Rate: PerSecond(1)}},
		"cost":            {{Name: "a", InFlight: 1, Cost: func(int64) int64 { return 1 }}},
		"negative":        {{Name: "a", InFlight: -1}},
		"lease too short": {{Name: "a", InFlight: 1, Lease: time.Millisecond}},
		"slot":            {{Name: "a", InFlight: 1, Slot: true}, {Name: "r", Rate: PerSecond(1)}},
	} {
		if _, err := All(memstore.New(memstore.WithSweepInterval(0)), dims); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want a *ConfigError", name, err)
		}
	}
	if _, err := Any(memstore.New(memstore.WithSweepInterval(0)), []Dimension{{Name: "a", InFlight: 1}, {Name: "r", Rate: PerSecond(1)}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Any: %v, want a *ConfigError", err)
	}
	if _, err := s.Reserve(bg, "k", 0); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("cost 0: %v", err)
	}
	if n, _ := inFlight(t, s, "k"); n != 0 {
		t.Fatalf("bad input took %d permits", n)
	}
}

// flightRun drives goroutines that loop Acquire, a call of callTime,
// Release, for d of the bubble's time, against a partner that counts the
// calls open at once; it returns the departures and the most open.
func flightRun(t *testing.T, s *Shaper, goroutines int, callTime, d time.Duration) (deps []conform.Departure, most int64) {
	t.Helper()
	var open, peak atomic.Int64
	var mu sync.Mutex
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for {
				ctx, cancel := context.WithDeadline(bg, end)
				r, err := s.Acquire(ctx, "k", 1)
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
					}
					return
				}
				n := open.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				mu.Lock()
				deps = append(deps, conform.Departure{At: algorithms.Millis(r.Time()), Cost: 1})
				mu.Unlock()
				time.Sleep(callTime)
				open.Add(-1)
				_ = r.Release(bg)
			}
		})
	}
	wg.Wait()
	return deps, peak.Load()
}

// When the rate binds (50/s, calls of 100 ms: 5 open on average, of 10
// allowed), waiting for permits wastes none of it: at least 97 % of the
// rate departs, within the contract, never more than 10 open.
func TestInFlightDeliversTheRateWhenItBinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{Name: "open", InFlight: 10}, Dimension{Name: "rate", Rate: PerSecond(50)})
		deps, most := flightRun(t, s, 64, 100*time.Millisecond, 10*time.Second)
		if most > 10 {
			t.Fatalf("%d calls open at once, more than 10", most)
		}
		if d, ok := conform.Check(20, 0, deps); !ok {
			t.Fatalf("departure at %v breaks 50/s", d.At)
		}
		if len(deps) < 485 { // 97 % of 500
			t.Fatalf("%d departures in 10 s, want at least 97 %% of 500", len(deps))
		}
		t.Logf("%d departures in 10 s (%.1f %% of the rate), at most %d open", len(deps), float64(len(deps))/5, most)
	})
}

// When concurrency binds (10 open, calls of 400 ms: 25/s, under the rate of
// 50/s), at least 95 % of n / call time departs, never more than 10 open.
func TestInFlightDeliversTheConcurrencyWhenItBinds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{Name: "open", InFlight: 10}, Dimension{Name: "rate", Rate: PerSecond(50)})
		deps, most := flightRun(t, s, 64, 400*time.Millisecond, 10*time.Second)
		if most > 10 {
			t.Fatalf("%d calls open at once, more than 10", most)
		}
		if d, ok := conform.Check(20, 0, deps); !ok {
			t.Fatalf("departure at %v breaks 50/s", d.At)
		}
		if len(deps) < 238 { // 95 % of 25/s over 10 s
			t.Fatalf("%d departures in 10 s, want at least 95 %% of 250", len(deps))
		}
		t.Logf("%d departures in 10 s (%.1f %% of n / call time), at most %d open", len(deps), float64(len(deps))/2.5, most)
	})
}

// A shaper with only an in-flight dimension: no pace, no pause, permits
// alone; Status reports them as the binding dimension.
func TestInFlightAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{InFlight: 2})
		deps, most := flightRun(t, s, 8, 100*time.Millisecond, time.Second)
		if most > 2 || len(deps) < 19 {
			t.Fatalf("%d departures, at most %d open; want about 20 and at most 2", len(deps), most)
		}
		if err := s.Pause(bg, "k", time.Second); err != nil {
			t.Fatal(err)
		}
		r, err := s.Acquire(bg, "k", 1)
		if err != nil || r.Delay != 0 {
			t.Fatalf("Acquire: %v, delay %v", err, r.Delay)
		}
		st, err := s.Status(bg, "k", 1)
		if err != nil || st.Binding != "" || st.Remaining != 1 || st.Dimensions[0].InFlight != 1 {
			t.Fatalf("Status: %+v, %v", st, err)
		}
		_ = r.Release(bg)
	})
}

// Permits beside the rest of the surface: a pause while a permit holder
// sleeps to its slot moves its slot past the pause and keeps its one
// permit; a live change while a request waits for a permit applies to
// the slot it takes; a settle charges the rate and leaves the permit to
// Release.
func TestInFlightWithPauseSettleAndLiveChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFlightShaper(t, Dimension{Name: "open", InFlight: 2}, Dimension{Name: "rate", Rate: PerSecond(10)})
		start := time.Now()
		a, err := s.Acquire(bg, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		bDone := make(chan Reservation)
		go func() {
			b, err := s.Acquire(bg, "k", 1) // its slot is 100 ms away
			if err != nil {
				t.Error(err)
			}
			bDone <- b
		}()
		synctest.Wait()
		if err := s.Pause(bg, "k", time.Second); err != nil {
			t.Fatal(err)
		}
		cDone := make(chan Reservation)
		go func() {
			c, err := s.Acquire(bg, "k", 1) // waits for a permit
			if err != nil {
				t.Error(err)
			}
			cDone <- c
		}()
		synctest.Wait()
		if n, w := inFlight(t, s, "k"); n != 2 || w != 1 {
			t.Fatalf("in flight %d, waiting %d; want 2 and 1", n, w)
		}
		b := <-bDone
		if got := b.Time().Sub(start); got < time.Second {
			t.Fatalf("b departs %v after the start, inside the pause", got)
		}
		if n, _ := inFlight(t, s, "k"); n != 2 {
			t.Fatalf("in flight %d after b re-reserved past the pause, want 2", n)
		}
		if err := s.SetRate(bg, "rate", PerSecond(2)); err != nil {
			t.Fatal(err)
		}
		if err := a.Settle(bg, 3); err != nil { // 2 more than reserved: charged to the rate
			t.Fatal(err)
		}
		if n, _ := inFlight(t, s, "k"); n != 2 {
			t.Fatalf("in flight %d after a settle, want 2: settling releases nothing", n)
		}
		if err := a.Release(bg); err != nil {
			t.Fatal(err)
		}
		c := <-cDone
		if gap := c.Time().Sub(b.Time()); gap < 500*time.Millisecond {
			t.Fatalf("c departs %v after b: the live rate of 2/s wants at least 500ms", gap)
		}
		if n, w := inFlight(t, s, "k"); n != 2 || w != 0 {
			t.Fatalf("in flight %d, waiting %d; want 2 and 0", n, w)
		}
		_, _ = b.Release(bg), c.Release(bg)
		if n, _ := inFlight(t, s, "k"); n != 0 {
			t.Fatalf("in flight %d at the end", n)
		}
	})
}
