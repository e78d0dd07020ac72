// Command pacing is ThrottleKit's demo: it paces outbound "calls" with a
// shaper on the in-memory store, on the real clock, and measures what a
// partner enforcing the same contract would see.
//
// It first fires the calls unshaped (all at once, as a plain client does), then
// shaped by several goroutines calling Wait on one key, in the default and in
// the precise sleep mode, and prints one line per run: achieved rate, the most
// calls in any 1 s window (what a strict partner counts), gaps and lateness.
//
//	go run ./examples/pacing [-rate 50/s] [-n 100] [-workers 4]
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

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

func main() {
	rate := flag.String("rate", "50/s", `contract, as shaper.ParseRate reads it ("50/s", "600/min burst 5")`)
	n := flag.Int("n", 100, "calls per run")
	workers := flag.Int("workers", 4, "goroutines sharing the bucket")
	flag.Parse()
	if err := run(os.Stdout, *rate, *n, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "pacing:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, rateText string, n, workers int) error {
	if n < 2 || workers < 1 {
		return fmt.Errorf("need -n >= 2 and -workers >= 1")
	}
	contract, err := shaper.ParseRate(rateText)
	if err != nil {
		return err
	}
	burst := max(contract.Burst, 1)
	rate := float64(contract.Count) * float64(time.Second) / float64(contract.Period) // per second
	bound := int(rate) + int(burst)                                                   // rate*1s + burst: the most a 1 s window may hold
	fmt.Fprintf(w, "contract: %v (%g calls/s, burst %d), so at most %d calls in any 1 s window\n", contract, rate, burst, bound)
	fmt.Fprintf(w, "%d calls per run, %d goroutines calling Wait on one key\n\n", n, workers)
	fmt.Fprintf(w, "%-18s %10s %12s %12s %12s %12s\n", "run", "rate/s", "max in 1 s", "gap p50", "gap p99", "late p99")
	verdict := "   <- breaks the contract"
	if n <= bound {
		verdict = "   (too few calls to break it: raise -n)"
	}
	fmt.Fprintf(w, "%-18s %10s %12d %12s %12s %12s%s\n", "unshaped", "-", n, "0s", "0s", "-", verdict)
	for _, precise := range []bool{false, true} {
		name := "shaped (default)"
		if precise {
			name = "shaped (precise)"
		}
		deps, late, err := shape(contract, n, workers, precise)
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

// shape runs n calls through workers goroutines that call Wait on one key of
// a shaper, and records when each call actually departed and how long after
// its slot.
func shape(contract shaper.Rate, n, workers int, precise bool) (deps []time.Time, late []time.Duration, err error) {
	store := memstore.New()
	defer store.Close()
	opts := []shaper.Option{shaper.WithMaxQueue(time.Minute)}
	if precise {
		opts = append(opts, shaper.WithPreciseSleep(0))
	}
	s, err := shaper.New(store, contract, opts...)
	if err != nil {
		return nil, nil, err
	}
	var (
		mu   sync.Mutex
		next int
		wg   sync.WaitGroup
		ctx  = context.Background()
	)
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				if next == n || err != nil {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				r, rerr := s.Reserve(ctx, "partner", 1)
				if rerr == nil {
					rerr = sleepUntil(ctx, r.Time(), precise)
				}
				departed := time.Now()
				mu.Lock()
				if rerr != nil {
					err = rerr
				}
				deps = append(deps, departed)
				late = append(late, departed.Sub(r.Time()))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return deps, late, err
}

// sleepUntil waits as Shaper.Wait does; the demo reserves and sleeps in two
// steps only so that it can report each call's lateness against its slot.
func sleepUntil(ctx context.Context, t time.Time, precise bool) error {
	if precise {
		return timer.SleepUntilPrecise(ctx, timer.Real(), t, 0)
	}
	return timer.SleepUntil(ctx, timer.Real(), t)
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
