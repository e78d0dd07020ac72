package algorithms

import (
	"math/rand/v2"
	"testing"
	"time"
)

// admissibleSubjects returns a random configuration of every algorithm.
func admissibleSubjects(rng *rand.Rand) []Algorithm {
	count := int64(1 + rng.IntN(5000))
	period := time.Duration(1+rng.IntN(3_600_000)) * time.Millisecond
	if rng.IntN(3) == 0 {
		period = time.Duration(1+rng.IntN(1_000_000)) * time.Microsecond
	}
	period = max(period, time.Duration(count)*11*time.Microsecond) // above the fastest rate accepted
	burst := int64(1 + rng.IntN(100))
	maxQueue := time.Duration(rng.Int64N(int64(10 * time.Minute)))
	if rng.IntN(4) == 0 {
		maxQueue = time.Duration(rng.IntN(100_000)) * time.Millisecond // whole ms, where the old rule rounded
	}
	r := Rate{Count: float64(count), Period: period, Burst: burst}
	limit := float64(count)
	buckets := 1 + rng.IntN(10)
	window := max(period, time.Duration(buckets)*MinWindow)
	return []Algorithm{
		must(NewLeakyBucket(r, maxQueue)),
		must(NewGCRA(r)),
		must(NewTokenBucket(r)),
		must(NewFixedWindow(limit, window)),
		must(NewSlidingWindow(limit, window, buckets)),
		must(NewSlidingLog(limit, window)),
		must(NewQuota(limit, Daily(time.Duration(rng.IntN(29)-14)*time.Hour))),
	}
}

// The admissibility rule is exact for every algorithm, at every now: the
// largest cost ValidateCost accepts (MaxCost) is admitted on a cold key, by
// Reserve and by All alike, and one more is refused with a *CostError before
// anything is read or written. The leaky bucket's old rule, (MaxQueue+tau)/T,
// rounded below an integer and called costs whose wait is exactly MaxQueue
// never admissible (thousands of configurations in a scan of this kind).
func TestAdmissibilityIsExactOnAColdKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	for range 8000 {
		for _, a := range admissibleSubjects(rng) {
			maxCost := MaxCost(a)
			if maxCost < 1 {
				t.Fatalf("%s %v: MaxCost %d", a.Name(), a, maxCost)
			}
			if err := a.ValidateCost(maxCost + 1); err == nil {
				t.Fatalf("%s: MaxCost %d, yet %d passes ValidateCost", a.Name(), maxCost, maxCost+1)
			}
			now := t0 + float64(rng.Int64N(int64(400*365*24*hour))) - 200*365*24*hour + rng.Float64()
			for _, c := range []int64{1, maxCost / 2, maxCost - 1, maxCost} {
				if c < 1 {
					continue
				}
				_, d, err := Reserve(a, nil, now, c)
				if err != nil || !d.Allowed {
					t.Fatalf("%s %+v: cost %d (MaxCost %d) on a cold key at %v: %+v %v", a.Name(), a, c, maxCost, now, d, err)
				}
				if DurationMillis(d.Delay) > a.MaxWait() {
					t.Fatalf("%s: delay %v beyond MaxWait %v", a.Name(), d.Delay, a.MaxWait())
				}
				dims := []Dim{{Alg: a, Cost: c}, {Alg: a, Cost: 1}}
				if ad, err := All(dims, now); err != nil || !ad.Allowed {
					t.Fatalf("%s: All with cost %d (MaxCost %d) on cold keys: %+v %v", a.Name(), c, maxCost, ad, err)
				}
			}
			st := State{now}
			if g, ok := a.(*GCRA); ok {
				st = State{now + g.Interval()}
			}
			for _, c := range []int64{maxCost + 1, maxCost + 2, 0, -1} {
				next, d, err := Reserve(a, st, now, c)
				var ce *CostError
				if !asCostError(err, &ce) || d.Allowed || !sameState(next, st) {
					t.Fatalf("%s: cost %d (MaxCost %d): %+v %v, state %v -> %v", a.Name(), c, maxCost, d, err, st, next)
				}
			}
		}
	}
}

func asCostError(err error, target **CostError) bool {
	ce, ok := err.(*CostError)
	if ok {
		*target = ce
	}
	return ok
}
