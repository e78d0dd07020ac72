package timer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// BenchmarkShapedSequentialCaller is the loop a single caller runs against the
// leaky-bucket shaper: reserve a slot at now, sleep until it, repeat. Because a
// late wake-up finds the TAT already in the past (tat = max(stored, now)), the
// time overslept is lost capacity; this reports the achieved rate as a
// percentage of the contract (burst 1) in each sleep mode.
func BenchmarkShapedSequentialCaller(b *testing.B) {
	for _, perSec := range []float64{1000, 5000} {
		for _, mode := range []string{"default", "precise"} {
			b.Run(fmt.Sprintf("%s/%g-per-s", mode, perSec), func(b *testing.B) {
				shaper, err := algorithms.NewLeakyBucket(algorithms.Rate{Count: perSec, Period: time.Second, Burst: 1}, time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				ctx, clock := context.Background(), timer.Real()
				var st algorithms.State
				start := clock.Now()
				b.ResetTimer()
				for range b.N {
					now := clock.Now()
					var d algorithms.Decision
					st, d, _ = algorithms.Reserve(shaper, st, algorithms.Millis(now), 1)
					if mode == "precise" {
						_ = timer.SleepUntilPrecise(ctx, clock, now.Add(d.Delay), 0)
					} else {
						_ = timer.SleepUntil(ctx, clock, now.Add(d.Delay))
					}
				}
				elapsed := time.Since(start)
				b.ReportMetric(100*float64(b.N)/(elapsed.Seconds()*perSec), "rate-%")
			})
		}
	}
}
