package algorithms

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestSlidingLog(t *testing.T) {
	t.Parallel()
	l := must(NewSlidingLog(3, time.Second))
	st := run(t, l, []step{
		{"t0", 0, 1, true, 0, 0, 2},
		{"t1=200ms cost 2", 200, 2, true, 0, 0, 0},
		{"t2=500ms full: the t0 entry frees at 1s", 500, 1, false, 0, 500, 0},
		{"t2 cost 3 waits for both entries: 1.2s", 500, 3, false, 0, 700, 0},
		{"t3=1s exactly: the t0 entry has expired", 1 * second, 1, true, 0, 0, 0},
		{"t4=1s full again", 1 * second, 1, false, 0, 200, 0},
		{"t5=1.2s", 1200, 2, true, 0, 0, 0},
	})
	if len(st) != 5 || st[0] != 3 { // total 3: the 1 s and 1.2 s entries; the older ones were dropped
		t.Fatalf("state %v, want two entries", st)
	}
}

// The retry-after is exact: denied at the last representable instant before
// it (times are float64 ms, about 0.24 µs apart today), admitted at it.
func TestSlidingLogExactRetryAfter(t *testing.T) {
	t.Parallel()
	l := must(NewSlidingLog(5, 1500*time.Millisecond))
	var st State
	for _, at := range []float64{0, 123.456, 123.456, 777.7, 1000.001} {
		st, _, _ = Reserve(l, st, t0+at, 1)
	}
	for _, cost := range []int64{1, 2, 3, 5} {
		now := t0 + 1200
		_, d, _ := Reserve(l, slices.Clone(st), now, cost)
		if d.Allowed {
			t.Fatalf("cost %d admitted on a full log", cost)
		}
		at := now + DurationMillis(d.RetryAfter)
		if _, d2, _ := Reserve(l, slices.Clone(st), at, cost); !d2.Allowed {
			t.Fatalf("cost %d: denied at its retry-after %v", cost, d.RetryAfter)
		}
		if _, d2, _ := Reserve(l, slices.Clone(st), math.Nextafter(at, 0), cost); d2.Allowed {
			t.Fatalf("cost %d: admitted at the last representable instant before its retry-after %v", cost, d.RetryAfter)
		}
	}
}

func TestSlidingLogBackwardClockStampsNoEarlier(t *testing.T) {
	t.Parallel()
	l := must(NewSlidingLog(2, time.Second))
	st := run(t, l, []step{
		{"t0", 5 * second, 1, true, 0, 0, 1},
		{"t-1 clock steps back 3 s: stamped at 5 s, not 2 s", 2 * second, 1, true, 0, 0, 0},
		{"t-1 full", 2 * second, 1, false, 0, 4 * second, 0},
		{"t1=5.999s both still live", 5999, 1, false, 0, 1, 0},
		{"t2=6s both expire together", 6 * second, 2, true, 0, 0, 0},
	})
	if len(st) != 3 || st[0] != 2 {
		t.Fatalf("state %v: want one merged entry of cost 2", st)
	}
}
