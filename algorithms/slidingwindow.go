package algorithms

import (
	"math"
	"slices"
	"time"
)

// MaxBuckets is the most sub-buckets a sliding window may have.
const MaxBuckets = 256

// SlidingWindow estimates the count over the last Window from S sub-bucket
// counters, epoch-aligned, each Window/S long. The S most recent buckets count
// in full and the bucket before them is weighted by the share of it that still
// lies inside the window, as if its requests had been spread evenly over it.
// S = 1 is the classic two-counter estimate (current window plus the previous
// one, weighted).
//
// The estimate can differ from the exact sliding count by at most the count of
// one sub-bucket, so more buckets mean a tighter bound and a larger state.
// Unlike a fixed window it does not let 2*Limit through across a boundary.
//
// A clock that steps back before the newest stored bucket is treated as being
// at the start of that bucket, where the estimate is highest.
//
// State layout: [index of the newest bucket, count of the newest bucket, ...,
// count of the bucket S before it] (S+2 numbers). The bucket index is
// floor(now / (Window/S)).
type SlidingWindow struct {
	limited
	width float64 // ms per sub-bucket
	n     int     // S
}

// NewSlidingWindow returns a sliding window of limit units per window, with
// buckets sub-buckets (1 to [MaxBuckets], each at least [MinWindow] long).
func NewSlidingWindow(limit float64, window time.Duration, buckets int) (*SlidingWindow, error) {
	if err := validateLimit("sliding-window", limit, window); err != nil {
		return nil, err
	}
	if buckets < 1 || buckets > MaxBuckets {
		return nil, &ConfigError{"sliding-window", "Buckets", buckets, "must be between 1 and 256"}
	}
	if window/time.Duration(buckets) < MinWindow {
		return nil, &ConfigError{"sliding-window", "Buckets", buckets, "each sub-bucket must be at least 1ms long"}
	}
	return &SlidingWindow{limited: limited{"sliding-window", limit}, width: DurationMillis(window) / float64(buckets), n: buckets}, nil
}

// view describes st as seen at now without modifying it: the bucket index in
// force, how far the stored buckets must shift to reach it, and the fraction
// of the current bucket already elapsed.
func (w *SlidingWindow) view(st State, now float64) (idx, shift, frac float64) {
	idx = math.Floor(now / w.width)
	if len(st) < w.n+2 {
		return idx, float64(w.n + 1), (now - float64(idx*w.width)) / w.width
	}
	if idx < st[0] { // the clock stepped back: stand at the start of the newest bucket
		return st[0], 0, 0
	}
	return idx, idx - st[0], (now - float64(idx*w.width)) / w.width
}

// count returns the count of the bucket age buckets before the current one,
// after a virtual shift.
func (w *SlidingWindow) count(st State, shift float64, age int) float64 {
	j := float64(age) - shift
	if j < 0 || j > float64(w.n) || len(st) < w.n+2 {
		return 0
	}
	return st[1+int(j)]
}

// estimate returns the weighted count: full buckets 0..S-1 plus bucket S
// weighted by 1-frac.
func (w *SlidingWindow) estimate(st State, shift, frac float64) float64 {
	full := 0.0
	for age := 0; age < w.n; age++ {
		full += w.count(st, shift, age)
	}
	return full + float64(w.count(st, shift, w.n)*(1-frac))
}

// Delay returns 0 if cost fits under the estimate, else the time until the
// exact instant at which the estimate first drops far enough, found by
// walking the bucket boundaries ahead (at most S+1 of them).
func (w *SlidingWindow) Delay(st State, now float64, cost int64) float64 {
	idx, shift, frac := w.view(st, now)
	c := float64(cost)
	if w.estimate(st, shift, frac)+c <= w.limit {
		return 0
	}
	for j := 0; j <= w.n; j++ {
		// During bucket idx+j the full buckets are ages 0..S-1-j (the j newer
		// ones are empty) and the partial one is age S-j.
		full := 0.0
		for age := 0; age < w.n-j; age++ {
			full += w.count(st, shift, age)
		}
		if full+c > w.limit {
			continue
		}
		start := 0.0
		if j == 0 {
			start = frac
		}
		need := start
		if old := w.count(st, shift, w.n-j); old > 0 {
			if f := 1 - (w.limit-c-full)/old; f > need {
				need = f
			}
		}
		if j == 0 && need == frac {
			return 0
		}
		return (float64((idx+float64(j))*w.width) + float64(need*w.width)) - now
	}
	return math.Inf(1) // unreachable for a valid cost: never admitted
}

// Commit shifts the buckets to now and adds cost to the newest.
func (w *SlidingWindow) Commit(st State, now, _ float64, cost int64) State {
	idx, shift, _ := w.view(st, now)
	if len(st) < w.n+2 {
		st = slices.Grow(st[:0], w.n+2)[:w.n+2]
		clear(st)
	} else if shift > 0 {
		k := int(min(shift, float64(w.n+1)))
		copy(st[1+k:], st[1:w.n+2-k])
		clear(st[1 : 1+k])
	}
	st[0] = idx
	st[1] += float64(cost)
	return st
}

// Params returns "s": limit, sub-bucket width, number of sub-buckets.
func (w *SlidingWindow) Params() (string, [6]float64) {
	return "s", [6]float64{w.limit, w.width, float64(w.n)}
}

// Status returns limit minus the estimate, and the time until the newest
// non-empty bucket has left the window.
func (w *SlidingWindow) Status(st State, now float64) (remaining, resetAfter float64) {
	idx, shift, frac := w.view(st, now)
	for age := 0; age <= w.n; age++ {
		if w.count(st, shift, age) > 0 {
			end := float64((idx-float64(age)+float64(w.n+1))*w.width) - now
			return w.limit - w.estimate(st, shift, frac), end
		}
	}
	return w.limit, 0
}
