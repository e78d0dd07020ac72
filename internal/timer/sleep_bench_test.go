//go:build unix

package timer

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSleepUntil paces a single sequential caller on an absolute schedule
// (deadline k*interval after the start, as a shaper does) and reports how late
// each wake-up is and how much CPU each sleep costs:
//
//	late-p50-us, late-p99-us  lateness of the wake-up after its deadline
//	cpu-us/op                 process CPU time per sleep (user + system)
//	rate-%                    achieved rate as a percentage of 1/interval
func BenchmarkSleepUntil(b *testing.B) {
	for _, interval := range []time.Duration{time.Millisecond, 200 * time.Microsecond} {
		for _, mode := range []string{"default", "precise"} {
			b.Run(mode+"/"+interval.String(), func(b *testing.B) {
				ctx, c := context.Background(), Real()
				late := make([]time.Duration, 0, b.N)
				cpu0, start := cpuTime(), time.Now()
				b.ResetTimer()
				for i := range b.N {
					deadline := start.Add(time.Duration(i+1) * interval)
					if mode == "precise" {
						_ = SleepUntilPrecise(ctx, c, deadline, 0)
					} else {
						_ = SleepUntil(ctx, c, deadline)
					}
					late = append(late, time.Since(deadline))
				}
				elapsed := time.Since(start)
				b.StopTimer()
				slices.Sort(late)
				b.ReportMetric(float64(late[len(late)/2].Microseconds()), "late-p50-us")
				b.ReportMetric(float64(late[len(late)*99/100].Microseconds()), "late-p99-us")
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
				b.ReportMetric(100*float64(time.Duration(b.N)*interval)/float64(elapsed), "rate-%")
			})
		}
	}
}
