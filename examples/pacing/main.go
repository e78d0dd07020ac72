// Command pacing is ThrottleKit's foundation demo: it paces outbound "calls"
// with the leaky-bucket shaper math (package algorithms) and the deadline
// sleeper (internal/timer), on the real clock, and measures what a partner
// enforcing the same contract would see.
//
// It first fires the calls unshaped (all at once, as a plain client does), then
// shaped by several goroutines sharing one bucket, in the default and in the
// precise sleep mode, and prints one line per run: achieved rate, the most
// calls in any 1 s window (what a strict partner counts), gaps and lateness.
//
// Until the shaper and transport packages exist, the demo holds the bucket's
// state under a mutex itself, which is what shaper's memory store will do per
// key.
//
//	go run ./examples/pacing [-rate 50] [-n 100] [-workers 4]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

func main() {
	rate := flag.Float64("rate", 50, "contract: calls per second")
	n := flag.Int("n", 100, "calls per run")
	workers := flag.Int("workers", 4, "goroutines sharing the bucket")
	flag.Parse()
	if err := run(os.Stdout, *rate, *n, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "pacing:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, rate float64, n, workers int) error {
	if n < 2 || workers < 1 {
		return fmt.Errorf("need -n >= 2 and -workers >= 1")
	}
	bucket, err := algorithms.NewLeakyBucket(algorithms.Rate{Count: rate, Period: time.Second, Burst: 1}, time.Minute)
	if err != nil {
		return err
	}
	bound := int(rate) + 1 // rate*1s + burst: the most a 1 s window may hold
	fmt.Fprintf(w, "contract: %g calls/s, burst 1, so at most %d calls in any 1 s window\n", rate, bound)
	fmt.Fprintf(w, "%d calls per run, %d goroutines sharing one bucket\n\n", n, workers)
	fmt.Fprintf(w, "%-18s %10s %12s %12s %12s %12s\n", "run", "rate/s", "max in 1 s", "gap p50", "gap p99", "late p99")
	fmt.Fprintf(w, "%-18s %10s %12d %12s %12s %12s   <- breaks the contract\n", "unshaped", "-", n, "0s", "0s", "-")
	for _, precise := range []bool{false, true} {
		name := "shaped (default)"
		if precise {
			name = "shaped (precise)"
		}
		deps, late, err := shape(bucket, n, workers, precise)
		if err != nil {
			return err
		}
		r := report(deps, late)
		fmt.Fprintf(w, "%-18s %10.2f %12d %12v %12v %12v\n", name, r.rate, r.maxIn1s, r.gapP50, r.gapP99, r.lateP99)
		if r.maxIn1s > bound {
			return fmt.Errorf("%s: %d calls in one second breaks the contract", name, r.maxIn1s)
		}
	}
	fmt.Fprintf(w, `
Shaped runs stay within %d per second. A window can hold %d rather than %d because
a wake-up a little late followed by one on time shortens a gap. Against a partner
that counts strictly %g per rolling second, set the rate a hair under the contract
(at %g/s the slots are %v apart, and that margin absorbs the jitter).
"late" is how long after its slot a call actually left.
`, bound, bound, bound-1, rate, 0.99*rate, time.Duration(float64(time.Second)/(0.99*rate)).Round(10*time.Microsecond))
	return nil
}

// shape runs n calls through workers goroutines that share one leaky bucket.
// Each call reserves a departure slot under the lock, then sleeps outside it
// until the slot, and records when it actually departed.
func shape(bucket *algorithms.GCRA, n, workers int, precise bool) (deps []time.Time, late []time.Duration, err error) {
	var (
		mu    sync.Mutex
		state algorithms.State
		next  int
		wg    sync.WaitGroup
		clock = timer.Real()
		ctx   = context.Background()
	)
	deps = make([]time.Time, 0, n)
	late = make([]time.Duration, 0, n)
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				if next == n || err != nil {
					mu.Unlock()
					return
				}
				next++
				now := clock.Now()
				var d algorithms.Decision
				var rerr error
				state, d, rerr = algorithms.Reserve(bucket, state, algorithms.Millis(now), 1)
				if rerr == nil && !d.Allowed {
					rerr = fmt.Errorf("queue full (retry after %v)", d.RetryAfter)
				}
				if rerr != nil {
					err = rerr
					mu.Unlock()
					return
				}
				mu.Unlock()
				slot := now.Add(d.Delay)
				if precise {
					_ = timer.SleepUntilPrecise(ctx, clock, slot, 0)
				} else {
					_ = timer.SleepUntil(ctx, clock, slot)
				}
				departed := clock.Now()
				mu.Lock()
				deps = append(deps, departed)
				late = append(late, departed.Sub(slot))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return deps, late, err
}

type summary struct {
	rate                    float64
	maxIn1s                 int
	gapP50, gapP99, lateP99 time.Duration
}

func report(deps []time.Time, late []time.Duration) summary {
	slices.SortFunc(deps, func(a, b time.Time) int { return a.Compare(b) })
	gaps := make([]time.Duration, 0, len(deps))
	for i := 1; i < len(deps); i++ {
		gaps = append(gaps, deps[i].Sub(deps[i-1]))
	}
	slices.Sort(gaps)
	slices.Sort(late)
	most, j := 0, 0
	for i := range deps {
		for j < len(deps) && deps[j].Sub(deps[i]) < time.Second {
			j++
		}
		most = max(most, j-i)
	}
	span := deps[len(deps)-1].Sub(deps[0])
	return summary{
		rate:    float64(len(deps)-1) / span.Seconds(),
		maxIn1s: most,
		gapP50:  gaps[len(gaps)/2].Round(time.Microsecond),
		gapP99:  gaps[len(gaps)*99/100].Round(time.Microsecond),
		lateP99: late[len(late)*99/100].Round(time.Microsecond),
	}
}
