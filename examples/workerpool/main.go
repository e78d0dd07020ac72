// Command workerpool paces a worker pool against per-tenant partner quotas:
// 40 sync jobs for tenant "acme" at 20/s and 20 for "globex" at 5/s, through
// one queue of 4 workers. Each tenant's jobs start at its own pace and neither
// waits for the other; the program prints progress and a summary.
//
//	go run ./examples/workerpool
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/queue"
	"github.com/throttlekit/throttlekit-go/shaper"
)

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "workerpool:", err)
		os.Exit(1)
	}
}

func run(w io.Writer) error {
	store := memstore.New()
	defer store.Close()
	rates := map[string]shaper.Rate{"acme": shaper.PerSecond(20), "globex": shaper.PerSecond(5)}
	jobs := map[string]int{"acme": 40, "globex": 20}
	tenants := map[string]shaper.Reserver{}
	for name, rate := range rates {
		s, err := shaper.New(store, rate, shaper.WithName(name))
		if err != nil {
			return err
		}
		tenants[name] = s
	}
	// One Reserver for the queue: each tenant's key goes to its own contract.
	r := shaper.Route(func(key string) shaper.Reserver { return tenants[key] })
	var mu sync.Mutex
	done := map[string]int{}
	first, last := map[string]time.Time{}, map[string]time.Time{}
	var failed []error
	q := queue.New(r, queue.WithWorkers(4), queue.WithErrorHandler(func(j queue.Job, err error) {
		mu.Lock()
		failed = append(failed, fmt.Errorf("%s: %w", j.Key, err))
		mu.Unlock()
	}))
	start := time.Now()
	for _, name := range []string{"acme", "globex"} {
		for range jobs[name] {
			job := queue.Job{Key: name, Run: func(context.Context) error {
				mu.Lock()
				defer mu.Unlock()
				now := time.Now()
				if done[name] == 0 {
					first[name] = now
				}
				done[name]++
				last[name] = now
				fmt.Fprintf(w, "\r%6.2fs  acme %2d/%d  globex %2d/%d", time.Since(start).Seconds(), done["acme"], jobs["acme"], done["globex"], jobs["globex"])
				return nil
			}}
			if err := q.Submit(context.Background(), job); err != nil {
				return err
			}
		}
	}
	if err := q.Close(context.Background()); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, name := range []string{"acme", "globex"} {
		span := last[name].Sub(first[name])
		fmt.Fprintf(w, "%-7s %d jobs, contract %v, achieved %.1f/s\n", name, done[name], rates[name], float64(done[name]-1)/span.Seconds())
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d jobs failed: %v", len(failed), failed)
	}
	return nil
}
