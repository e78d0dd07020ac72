package shaper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
)

func TestReserveGivesSlotsAndRefusesPastMaxQueue(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerSecond(10), WithMaxQueue(250*time.Millisecond))
	for k, want := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond} {
		if r := mustReserve(t, s, "a", 1); r.Delay != want || !r.Time().Equal(t0.Add(want)) {
			t.Fatalf("reservation %d: delay %v at %v, want %v", k, r.Delay, r.Time(), want)
		}
	}
	_, err := s.Reserve(bg, "a", 1)
	var qf *QueueFullError
	if !errors.Is(err, ErrQueueFull) || !errors.As(err, &qf) || qf.Key != "a" || qf.Delay != 300*time.Millisecond || qf.MaxQueue != 250*time.Millisecond {
		t.Fatalf("4th: %v (%+v), want a QueueFullError for a 300ms wait", err, qf)
	}
	if r := mustReserve(t, s, "b", 1); r.Delay != 0 {
		t.Fatalf("another key waits %v", r.Delay)
	}
}

func TestWaitSleepsUntilTheSlot(t *testing.T) {
	t.Parallel()
	s, _, clock := newTest(t, PerSecond(10))
	if err := s.Wait(bg, "k", 1); err != nil { // the first slot is now
		t.Fatal(err)
	}
	done := waitAsync(bg, s, "k", 1)
	armed(t, clock, 1)
	clock.Advance(99 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v before its slot", err)
	case <-time.After(20 * time.Millisecond):
	}
	clock.Advance(time.Millisecond)
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
}

// Wait past a deadline fails at once, matches context.DeadlineExceeded and
// consumes nothing: the next reservation gets the slot the refused one had.
func TestWaitPastDeadlineConsumesNothing(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerSecond(10))
	mustReserve(t, s, "k", 1)
	mustReserve(t, s, "k", 1) // slot at +100ms
	ctx, cancel := context.WithTimeout(bg, 150*time.Millisecond)
	defer cancel()
	for range 3 { // the +200ms slot, three times over: each refusal gives it back
		err := s.Wait(ctx, "k", 1)
		var de *DeadlineError
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &de) || !about(de.Delay, 200*time.Millisecond) {
			t.Fatalf("Wait = %v, want a DeadlineError for a 200ms wait", err)
		}
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 200*time.Millisecond {
		t.Fatalf("after the refusals the next slot is %v away, want 200ms (nothing consumed)", r.Delay)
	}
}

// Wait cancelled mid-sleep returns ctx.Err() unchanged and refunds its slot,
// which was the tail of the key's schedule.
func TestWaitCancelledMidSleepRefundsTail(t *testing.T) {
	t.Parallel()
	s, _, clock := newTest(t, PerSecond(10))
	mustReserve(t, s, "k", 1)
	ctx, cancel := context.WithCancel(bg)
	done := waitAsync(ctx, s, "k", 1) // slot at +100ms
	armed(t, clock, 1)
	clock.Advance(50 * time.Millisecond)
	cancel()
	if err := result(t, done); err != context.Canceled {
		t.Fatalf("Wait = %v, want context.Canceled unchanged", err)
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 50*time.Millisecond {
		t.Fatalf("next slot %v away, want the refunded +100ms slot (50ms from now)", r.Delay)
	}
}

// A cancelled slot is not lost: one with reservations after it is handed
// to the next reservation that can depart then, the tail comes back to the
// key, and a copy cancelled again gives nothing twice.
func TestACancelledSlotIsHandedOn(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerSecond(10))
	mustReserve(t, s, "k", 1)
	a := mustReserve(t, s, "k", 1) // +100ms
	mustReserve(t, s, "k", 1)      // +200ms
	copyOfA := a
	if err := a.Cancel(bg); err != nil {
		t.Fatal(err)
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 100*time.Millisecond {
		t.Fatalf("after a's cancel the next waits %v, want a's 100ms slot", r.Delay)
	}
	if err := copyOfA.Cancel(bg); err != nil {
		t.Fatal(err)
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 300*time.Millisecond {
		t.Fatalf("a copy of a cancelled again freed its slot twice: the next waits %v, want 300ms", r.Delay)
	}
	c := mustReserve(t, s, "k", 1) // +400ms, the tail
	_ = c.Cancel(bg)
	_ = c.Cancel(bg) // twice: no double refund
	if r := mustReserve(t, s, "k", 1); r.Delay != 400*time.Millisecond {
		t.Fatalf("after cancelling the tail: next at %v, want its 400ms slot", r.Delay)
	}
	var zero Reservation
	if err := zero.Cancel(bg); err != nil {
		t.Fatal(err)
	}
}

func TestAllowNeverQueues(t *testing.T) {
	t.Parallel()
	s, _, clock := newTest(t, PerSecond(10).WithBurst(2))
	for i, want := range []bool{true, true, false, false} {
		if ok, err := s.Allow(bg, "k", 1); ok != want || err != nil {
			t.Fatalf("Allow %d = %v, %v; want %v", i, ok, err, want)
		}
	}
	clock.Advance(100 * time.Millisecond)
	if ok, _ := s.Allow(bg, "k", 1); !ok {
		t.Fatal("Allow refused after one interval")
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 100*time.Millisecond {
		t.Fatalf("refused Allows consumed: Reserve waits %v, want 100ms", r.Delay)
	}
}

func TestPauseHoldsEveryDepartureThenResumes(t *testing.T) {
	t.Parallel()
	s, _, clock := newTest(t, PerSecond(10))
	if err := s.Pause(bg, "k", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(bg, "k", time.Second); err != nil { // shorter: does not shorten
		t.Fatal(err)
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 2*time.Second {
		t.Fatalf("first departure during the pause in %v, want 2s", r.Delay)
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 2100*time.Millisecond {
		t.Fatalf("second in %v, want 2.1s (paced after the pause)", r.Delay)
	}
	if ok, _ := s.Allow(bg, "other", 1); !ok {
		t.Fatal("a pause of k held another key")
	}
	clock.Advance(3 * time.Second)
	if r := mustReserve(t, s, "k", 1); r.Delay != 0 {
		t.Fatalf("after the pause and the schedule: %v", r.Delay)
	}
	if err := s.Pause(bg, "k", 0); err != nil {
		t.Fatal(err)
	}
	// A window algorithm pauses too, and consumes nothing while paused.
	w, _, wclock := newTest(t, PerSecond(2), WithAlgorithm(FixedWindow))
	_ = w.Pause(bg, "k", 500*time.Millisecond)
	if ok, _ := w.Allow(bg, "k", 1); ok {
		t.Fatal("a paused fixed window admitted")
	}
	wclock.Advance(500 * time.Millisecond)
	for range 2 {
		if ok, _ := w.Allow(bg, "k", 1); !ok {
			t.Fatal("after the pause the window's full limit should be there")
		}
	}
}

func TestResetForgetsTheKey(t *testing.T) {
	t.Parallel()
	s, store, _ := newTest(t, PerSecond(1))
	mustReserve(t, s, "k", 1)
	_ = s.Pause(bg, "k", time.Hour)
	if store.Len() != 2 { // the state and the pause record
		t.Fatalf("Len = %d, want 2", store.Len())
	}
	if err := s.Reset(bg, "k"); err != nil {
		t.Fatal(err)
	}
	// The pause goes; the state keeps only the Ledger that gives the
	// reservation granted before nothing back, until its term has passed
	// (TestAResetDetachesTheReservationsGrantedBeforeIt).
	if store.Len() != 1 {
		t.Fatalf("Len after Reset = %d, want 1", store.Len())
	}
	if r := mustReserve(t, s, "k", 1); r.Delay != 0 {
		t.Fatalf("after Reset the key waits %v (state or pause survived)", r.Delay)
	}
}

func TestCancelledContextConsumesNothing(t *testing.T) {
	t.Parallel()
	s, store, _ := newTest(t, PerSecond(1))
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := s.Reserve(ctx, "k", 1); err != context.Canceled {
		t.Fatalf("Reserve = %v", err)
	}
	if err := s.Wait(ctx, "k", 1); err != context.Canceled {
		t.Fatalf("Wait = %v", err)
	}
	if err := s.Pause(ctx, "k", time.Second); err != context.Canceled {
		t.Fatalf("Pause = %v", err)
	}
	if store.Len() != 0 {
		t.Fatal("a cancelled context consumed")
	}
}

func TestBadInputIsTypedAndWritesNothing(t *testing.T) {
	t.Parallel()
	s, store, _ := newTest(t, PerSecond(10).WithBurst(3), WithMaxQueue(time.Second))
	long := strings.Repeat("x", MaxKeyLen+1)
	for _, c := range []struct {
		key  string
		cost int64
		is   error
	}{
		{"k", 0, ErrInvalidCost}, {"k", -5, ErrInvalidCost}, {"k", 14, ErrInvalidCost}, // 14 units need 1.1 s
		{long, 1, ErrInvalidKey},
	} {
		if _, err := s.Reserve(bg, c.key, c.cost); !errors.Is(err, c.is) {
			t.Errorf("Reserve(%d-byte key, %d) = %v, want %v", len(c.key), c.cost, err, c.is)
		}
		if err := s.Wait(bg, c.key, c.cost); !errors.Is(err, c.is) {
			t.Errorf("Wait(%d-byte key, %d) = %v, want %v", len(c.key), c.cost, err, c.is)
		}
		if _, err := s.Allow(bg, c.key, c.cost); !errors.Is(err, c.is) {
			t.Errorf("Allow(%d-byte key, %d) = %v, want %v", len(c.key), c.cost, err, c.is)
		}
	}
	if err := s.Pause(bg, "k", MaxPause+1); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Pause beyond MaxPause = %v", err)
	}
	if err := s.Pause(bg, "k", time.Duration(1<<63-1)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Pause(max duration) = %v", err)
	}
	if err := s.Pause(bg, long, time.Second); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Pause(long key) = %v", err)
	}
	if err := s.Reset(bg, long); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Reset(long key) = %v", err)
	}
	if store.Len() != 0 {
		t.Fatalf("bad input wrote %d keys", store.Len())
	}
	// Odd but valid keys work: empty, invalid UTF-8, braces, spaces, non-ASCII.
	for _, k := range []string{"", "\xff\xfe", "{tag}", "a b", "ключ"} {
		if _, err := s.Reserve(bg, k, 1); err != nil {
			t.Errorf("key %q: %v", k, err)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.WithSweepInterval(0))
	for name, c := range map[string]struct {
		store Store
		rate  Rate
		opts  []Option
	}{
		"nil store":        {nil, PerSecond(1), nil},
		"zero count":       {store, Rate{Period: time.Second}, nil},
		"zero period":      {store, Rate{Count: 1}, nil},
		"negative burst":   {store, PerSecond(1).WithBurst(-1), nil},
		"negative queue":   {store, PerSecond(1), []Option{WithMaxQueue(-time.Second)}},
		"nil clock":        {store, PerSecond(1), []Option{WithClock(nil)}},
		"zero algorithm":   {store, PerSecond(1), []Option{WithAlgorithm(Algorithm{})}},
		"bad buckets":      {store, PerSecond(1), []Option{WithAlgorithm(SlidingWindowBuckets(0))}},
		"bad quota offset": {store, PerSecond(1), []Option{WithAlgorithm(Quota(Daily(15 * time.Hour)))}},
		"window under 1ms": {store, Every(time.Microsecond), []Option{WithAlgorithm(FixedWindow)}},
	} {
		s, err := New(c.store, c.rate, c.opts...)
		var ce *ConfigError
		if s != nil || !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) {
			t.Errorf("%s: New = %v, %v; want a *ConfigError", name, s, err)
		}
	}
	if _, err := All(store, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("All with no dimensions: %v", err)
	}
	if _, err := All(store, []Dimension{{Name: "a", Rate: PerSecond(1)}, {Rate: PerSecond(1)}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("unnamed dimension: %v", err)
	}
	if _, err := All(store, []Dimension{{Name: "a", Rate: PerSecond(1)}, {Name: "a", Rate: PerSecond(1)}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("duplicate names: %v", err)
	}
	bad := memstore.New(memstore.WithMaxKeys(-1))
	if _, err := New(bad, PerSecond(1)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("store with MaxKeys -1: %v", err)
	}
	if bad.Close() != nil || store.Close() != nil {
		t.Error("Close failed")
	}
}

func TestSharedPrefixNeedsTheSameConfiguration(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.WithSweepInterval(0))
	a, err := New(store, PerSecond(10), WithName("api"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(store, PerSecond(10), WithName("api")) // same config: shares the budget
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, a, "k", 1)
	if r := mustReserve(t, b, "k", 1); r.Delay == 0 {
		t.Fatal("two shapers on one prefix did not share the key's budget")
	}
	if _, err := New(store, PerSecond(20), WithName("api")); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a different rate on the same prefix: %v, want ErrInvalidConfig", err)
	}
	if _, err := New(store, PerSecond(20), WithName("other")); err != nil {
		t.Fatalf("a different name: %v", err)
	}
}

// A pause that begins while Wait sleeps to its slot (another process saw the
// partner's Retry-After) holds the request until the pause ends.
func TestWaitHoldsForAPauseThatBeganWhileSleeping(t *testing.T) {
	t.Parallel()
	s, _, clock := newTest(t, PerSecond(10))
	mustReserve(t, s, "k", 1)
	done := waitAsync(bg, s, "k", 1) // slot at +100ms
	armed(t, clock, 1)
	if err := s.Pause(bg, "k", time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(100 * time.Millisecond) // the slot comes: the pause has 900 ms left
	armed(t, clock, 1)
	clock.Advance(899 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v inside the pause", err)
	case <-time.After(20 * time.Millisecond):
	}
	clock.Advance(time.Millisecond)
	if err := result(t, done); err != nil {
		t.Fatal(err)
	}
	if !clock.Now().Equal(t0.Add(time.Second)) {
		t.Fatalf("released at %v, want the pause's end", clock.Now().Sub(t0))
	}
}

// Requests asleep in Wait when a pause begins leave paced after it, not
// together at its end: their slots were inside the pause and are lost.
func TestWaitersHeldByAPauseLeavePaced(t *testing.T) {
	t.Parallel()
	s, _, clock := newTest(t, PerSecond(10))
	mustReserve(t, s, "k", 1)
	const n = 5
	var mu sync.Mutex
	var left []time.Duration
	done := make(chan error, n)
	for range n {
		go func() {
			err := s.Wait(bg, "k", 1)
			mu.Lock()
			left = append(left, clock.Now().Sub(t0))
			mu.Unlock()
			done <- err
		}()
	}
	armed(t, clock, n) // slots at +100..+500 ms
	if err := s.Pause(bg, "k", time.Second); err != nil {
		t.Fatal(err)
	}
	// Step the clock 10 ms at a time so that each sleeper wakes, re-reserves
	// and sleeps again before the next step.
	for clock.Now().Sub(t0) < 2*time.Second {
		clock.Advance(10 * time.Millisecond)
		for {
			mu.Lock()
			settled := clock.Pending()+len(left) == n
			mu.Unlock()
			if settled {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	for range n {
		if err := result(t, done); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(left)
	want := []time.Duration{1000 * time.Millisecond, 1100 * time.Millisecond, 1200 * time.Millisecond, 1300 * time.Millisecond, 1400 * time.Millisecond}
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Fatalf("departures at %v, want paced from the pause's end %v", left, want)
	}
}
