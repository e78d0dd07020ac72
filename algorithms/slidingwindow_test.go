package algorithms

import (
	"math"
	"slices"
	"testing"
	"time"
)

func TestSlidingWindowClassicEstimate(t *testing.T) {
	t.Parallel()
	// S = 1: 10 per 1 s, estimate = current + previous*(1 - elapsed fraction).
	w := must(NewSlidingWindow(10, time.Second, 1))
	run(t, w, []step{
		{"t0 window 0 takes 10", 0, 10, true, 0, 0, 0},
		{"t1=1s new window: previous weighs 10*(1-0) = 10", 1 * second, 1, false, 0, 100, 0},
		{"t2=1.1s previous weighs 9: one fits", 1100, 1, true, 0, 0, 0},
		{"t3=1.5s 5 + 1 = 6: four fit", 1500, 4, true, 0, 0, 0},
		{"t4=1.5s full", 1500, 1, false, 0, 100, 0},
		{"t5=3s both windows aged out", 3 * second, 10, true, 0, 0, 0},
	})
}

func TestSlidingWindowDoesNotDoubleAcrossABoundary(t *testing.T) {
	t.Parallel()
	for _, s := range []int{1, 4, 10} {
		w := must(NewSlidingWindow(5, time.Second, s))
		var st State
		admitted := 0
		// Spend the limit just before a boundary, then hammer just after it.
		for _, at := range []float64{999, 999, 999, 999, 999, 1000, 1000, 1001, 1001, 1010} {
			var d Decision
			st, d, _ = Reserve(w, st, t0+at, 1)
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 5 {
			t.Fatalf("S=%d: admitted %d across the boundary, want the limit 5", s, admitted)
		}
	}
}

// The retry-after is the instant the estimate first allows the request: denied
// just before it, admitted at it.
func TestSlidingWindowRetryAfterIsTight(t *testing.T) {
	t.Parallel()
	for _, s := range []int{1, 3, 8} {
		w := must(NewSlidingWindow(10, 2*time.Second, s))
		var st State
		for i, at := range []float64{0, 300, 700, 1200, 1600, 1900} {
			st, _, _ = Reserve(w, st, t0+at, int64(1+i%2))
		}
		for _, probe := range []float64{1900, 2100, 2500, 3300} {
			for _, cost := range []int64{1, 4, 9} {
				_, d, _ := Reserve(w, slices.Clone(st), t0+probe, cost)
				if d.Allowed {
					continue
				}
				at := t0 + probe + DurationMillis(d.RetryAfter)
				if _, d2, _ := Reserve(w, slices.Clone(st), at+1e-3, cost); !d2.Allowed {
					t.Fatalf("S=%d probe %v cost %d: denied 1 µs after the retry-after %v", s, probe, cost, d.RetryAfter)
				}
				if _, d2, _ := Reserve(w, slices.Clone(st), at-0.05, cost); d2.Allowed {
					t.Fatalf("S=%d probe %v cost %d: admitted 50 µs before the retry-after %v", s, probe, cost, d.RetryAfter)
				}
			}
		}
	}
}

// The estimate differs from the exact count over the trailing window by at
// most the count of one sub-bucket.
func TestSlidingWindowErrorBoundedByOneBucket(t *testing.T) {
	t.Parallel()
	const S = 4
	w := must(NewSlidingWindow(1000, time.Second, S))
	var st State
	var times []float64
	for i := range 400 {
		at := t0 + float64(i*7%1000) + float64(i/100)*second/4
		if len(times) > 0 && at < times[len(times)-1] {
			at = times[len(times)-1]
		}
		var d Decision
		st, d, _ = Reserve(w, st, at, 1)
		if !d.Allowed {
			t.Fatalf("request %d unexpectedly denied", i)
		}
		times = append(times, at)
		exact := 0.0
		for _, x := range times {
			if x > at-second {
				exact++
			}
		}
		idx, shift, frac := w.view(st, at)
		_ = idx
		est := w.estimate(st, shift, frac)
		maxBucket := 0.0
		for _, c := range st[1:] {
			maxBucket = math.Max(maxBucket, c)
		}
		if math.Abs(est-exact) > maxBucket {
			t.Fatalf("at request %d: estimate %v, exact %v, differ by more than one bucket (%v)", i, est, exact, maxBucket)
		}
	}
}

func TestSlidingWindowBackwardClock(t *testing.T) {
	t.Parallel()
	w := must(NewSlidingWindow(4, time.Second, 2))
	run(t, w, []step{
		{"t0", 2 * second, 3, true, 0, 0, 1},
		{"t-1 clock steps back 1.5 s: counted at the newest bucket's start", 500, 1, true, 0, 0, 0},
		{"t-1 full: the newest bucket (2-2.5 s) weighs 3/4 at 3.125 s", 500, 1, false, 0, 3125 - 500, 0},
	})
}

func TestWindowConfigErrors(t *testing.T) {
	t.Parallel()
	nan := math.NaN()
	for _, c := range []struct {
		limit   float64
		window  time.Duration
		buckets int
	}{
		{0, time.Second, 1}, {-1, time.Second, 1}, {nan, time.Second, 1}, {math.Inf(1), time.Second, 1},
		{10, 999 * time.Microsecond, 1}, {10, 0, 1},
		{10, time.Second, 0}, {10, time.Second, MaxBuckets + 1}, {10, 10 * time.Millisecond, 20},
	} {
		if _, err := NewSlidingWindow(c.limit, c.window, c.buckets); err == nil {
			t.Errorf("NewSlidingWindow(%v, %v, %d) accepted", c.limit, c.window, c.buckets)
		}
		if c.buckets == 1 {
			if _, err := NewFixedWindow(c.limit, c.window); err == nil {
				t.Errorf("NewFixedWindow(%v, %v) accepted", c.limit, c.window)
			}
			if _, err := NewSlidingLog(c.limit, c.window); err == nil {
				t.Errorf("NewSlidingLog(%v, %v) accepted", c.limit, c.window)
			}
		}
	}
}
