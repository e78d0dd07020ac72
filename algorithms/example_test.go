package algorithms_test

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
)

var start = algorithms.Millis(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))

// Five requests arrive at once at a cold key limited to 10 per second: the
// shaper gives each its departure slot, 100 ms apart, and refuses the one
// whose wait would pass MaxQueue.
func ExampleNewLeakyBucket() {
	shaper, err := algorithms.NewLeakyBucket(algorithms.Rate{Count: 10, Period: time.Second, Burst: 1}, 350*time.Millisecond)
	if err != nil {
		panic(err)
	}
	var st algorithms.State
	for range 5 {
		var d algorithms.Decision
		st, d, _ = algorithms.Reserve(shaper, st, start, 1)
		if d.Allowed {
			fmt.Println("depart after", d.Delay)
		} else {
			fmt.Println("refused; retry after", d.RetryAfter)
		}
	}
	// Output:
	// depart after 0s
	// depart after 100ms
	// depart after 200ms
	// depart after 300ms
	// refused; retry after 50ms
}

// GCRA refuses instead of waiting: a burst of 3, then one every 100 ms.
func ExampleNewGCRA() {
	g, _ := algorithms.NewGCRA(algorithms.Rate{Count: 10, Period: time.Second, Burst: 3})
	var st algorithms.State
	for _, at := range []float64{0, 0, 0, 0, 100} {
		var d algorithms.Decision
		st, d, _ = algorithms.Reserve(g, st, start+at, 1)
		fmt.Printf("t+%gms allowed=%v remaining=%d retry=%v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// t+0ms allowed=true remaining=2 retry=0s
	// t+0ms allowed=true remaining=1 retry=0s
	// t+0ms allowed=true remaining=0 retry=0s
	// t+0ms allowed=false remaining=0 retry=100ms
	// t+100ms allowed=true remaining=0 retry=0s
}

// A monthly quota at UTC+2: the month ends at local midnight, 22:00 UTC on
// the last day.
func ExampleNewQuota() {
	q, _ := algorithms.NewQuota(1000, algorithms.Monthly(2*time.Hour))
	now := algorithms.Millis(time.Date(2028, 2, 29, 20, 0, 0, 0, time.UTC))
	st, _, _ := algorithms.Reserve(q, nil, now, 1000)
	_, d, _ := algorithms.Reserve(q, st, now, 1)
	fmt.Println("allowed:", d.Allowed)
	fmt.Println("next month starts at", time.Unix(0, 0).Add(time.Duration(now*1e6)+d.RetryAfter).UTC().Format(time.RFC3339))
	// Output:
	// allowed: false
	// next month starts at 2028-02-29T22:00:00Z
}

// An LLM API allows 3 requests and 300 tokens per second on one account. A
// request costs 1 request and its tokens; it departs when both dimensions
// allow it, and the decision names the dimension that bound. (Delays are
// rounded to 0.1 ms here: instants are float64 milliseconds, which resolve
// 2^-12 ms today, and the interval is rounded up to a whole step, never
// early: 1000/300 ms becomes 3.33349609375, 26 µs later over 160 tokens.)
func ExampleAll() {
	requests, _ := algorithms.NewLeakyBucket(algorithms.Rate{Count: 3, Period: time.Second, Burst: 1}, time.Minute)
	tokens, _ := algorithms.NewLeakyBucket(algorithms.Rate{Count: 300, Period: time.Second, Burst: 100}, time.Minute)
	dims := []algorithms.Dim{{Alg: requests}, {Alg: tokens}}
	names := []string{"requests", "tokens"}
	for _, n := range []int64{10, 250, 10, 10} {
		dims[0].Cost, dims[1].Cost = 1, n
		d, _ := algorithms.All(dims, start)
		fmt.Printf("%3d tokens: depart after %v (bound by %s)\n", n, d.Delay.Round(100*time.Microsecond), names[d.Binding])
	}
	// Output:
	//  10 tokens: depart after 0s (bound by requests)
	// 250 tokens: depart after 533.4ms (bound by tokens)
	//  10 tokens: depart after 866.7ms (bound by requests)
	//  10 tokens: depart after 1.2s (bound by requests)
}
