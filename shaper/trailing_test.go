package shaper

import (
	"testing"
	"time"
)

// slots reserves n requests of cost on k and returns their delays.
func slots(t *testing.T, s *Shaper, k string, n int, cost int64) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = mustReserve(t, s, k, cost).Delay
	}
	return out
}

// A trailing window paces its requests at Count per Period, and its log
// holds the next window's first one until the spread has passed too.
func TestTrailingWindowSchedule(t *testing.T) {
	s, _, _ := newTest(t, Rate{Count: 10, Period: time.Second}, WithAlgorithm(TrailingWindow))
	for i, d := range slots(t, s, "k", 25, 1) {
		if want := time.Duration(i) * 100 * time.Millisecond; d != want {
			t.Fatalf("request %d: delay %v, want %v (paced at 10/s)", i, d, want)
		}
	}
	s, _, _ = newTest(t, Rate{Count: 10, Period: time.Second}, WithAlgorithm(TrailingWithin(50*time.Millisecond)))
	got := slots(t, s, "k", 21, 1)
	for i, want := range map[int]time.Duration{9: 900 * time.Millisecond, 10: 1050 * time.Millisecond, 11: 1150 * time.Millisecond, 20: 2100 * time.Millisecond} {
		if got[i] != want {
			t.Errorf("request %d: delay %v, want %v (10 in any 1.05 s)", i, got[i], want)
		}
	}
}

// A settle for less gives the pace back at once: the next request leaves
// earlier, where the log has room for it.
func TestTrailingWindowSettleGivesBack(t *testing.T) {
	for _, settle := range []bool{false, true} {
		s, _, _ := newTest(t, Rate{Count: 10, Period: time.Second}, WithAlgorithm(TrailingWindow))
		_ = mustReserve(t, s, "k", 5)
		r := mustReserve(t, s, "k", 5)
		if r.Delay != 500*time.Millisecond {
			t.Fatalf("the second 5: delay %v, want 500ms", r.Delay)
		}
		want := time.Second
		if settle {
			if err := r.Settle(bg, 1); err != nil {
				t.Fatal(err)
			}
			want = 600 * time.Millisecond // the pace is back by 4 units; the log holds 6 until 1s
		}
		if d := mustReserve(t, s, "k", 4).Delay; d != want {
			t.Errorf("settled %v: 4 more leave after %v, want %v", settle, d, want)
		}
	}
}

// A reservation of a trailing window and its copies give back once: the
// log cannot tell them apart, so they share the record of it.
func TestTrailingWindowCopiesGiveBackOnce(t *testing.T) {
	s, _, _ := newTest(t, Rate{Count: 10, Period: time.Second}, WithAlgorithm(TrailingWindow))
	first := mustReserve(t, s, "k", 5)
	second := mustReserve(t, s, "k", 5) // merged with nothing: its own entry at 500ms
	cp := second
	if err := second.Settle(bg, 1); err != nil {
		t.Fatal(err)
	}
	if err := cp.Settle(bg, 1); err != ErrSettled {
		t.Fatalf("the copy's settle: %v, want ErrSettled", err)
	}
	if err := cp.Cancel(bg); err != nil {
		t.Fatalf("the copy's cancel: %v", err)
	}
	// 6 units in the window until 1s (the pace is back by 4): a request of 4
	// leaves at 600ms; had the copy given back again, one of 8 would too.
	if d := mustReserve(t, s, "k", 8).Delay; d != time.Second {
		t.Fatalf("8 more: delay %v, want 1s (given back once)", d)
	}
	_ = first
}

// WithLateness: a waiter that wakes later after its slot than the bound
// gives that slot back and takes a new one (here free at once, the one it
// gave back being the newest) instead of leaving on the stale one; one
// that wakes within the bound leaves on its slot.
func TestLatenessRetakesALateSlot(t *testing.T) {
	for _, alg := range []Algorithm{LeakyBucket, TrailingWindow, CostBucket} {
		s, _, clock := newTest(t, PerSecond(10), WithAlgorithm(alg), WithLateness(5*time.Millisecond))
		_ = mustReserve(t, s, "k", 1)
		ch := waitAsync(bg, s, "k", 1) // its slot is at 100ms
		armed(t, clock, 1)
		clock.Advance(120 * time.Millisecond) // it wakes 20ms late
		if err := result(t, ch); err != nil {
			t.Fatalf("%v: %v", alg, err)
		}
		if n := s.lates.Load(); n != 1 {
			t.Fatalf("%v: %d slots retaken, want 1", alg, n)
		}
		// The retaken slot is at 120ms: the next is at 220ms (210ms for the
		// trailing window, whose pace tolerates a hundredth of its window).
		want := 100 * time.Millisecond
		if alg == TrailingWindow {
			want = 90 * time.Millisecond
		}
		if d := mustReserve(t, s, "k", 1).Delay; d != want {
			t.Fatalf("%v: the next slot is %v away, want %v (the late slot was given back and retaken at 120ms)", alg, d, want)
		}
		ch = waitAsync(bg, s, "k", 1) // 100ms after that one
		armed(t, clock, 1)
		clock.Advance(want + 104*time.Millisecond) // 4ms late: within the bound
		if err := result(t, ch); err != nil || s.lates.Load() != 1 {
			t.Fatalf("%v: on time: %v, %d retaken", alg, err, s.lates.Load())
		}
	}
}
