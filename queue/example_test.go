package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/queue"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// A pool of workers sends paced jobs; a failing job's error reaches the error
// handler, and Close drains everything accepted.
func Example() {
	store := memstore.New()
	defer store.Close()
	s, _ := shaper.New(store, shaper.PerSecond(50))
	var failures atomic.Int32
	q := queue.New(s, queue.WithWorkers(4), queue.WithErrorHandler(func(j queue.Job, err error) {
		failures.Add(1)
	}))
	var sent atomic.Int32
	for i := range 10 {
		_ = q.Submit(context.Background(), queue.Job{Key: "partner", Run: func(context.Context) error {
			sent.Add(1)
			if i == 3 {
				return errors.New("partner said no")
			}
			return nil
		}})
	}
	_ = q.Close(context.Background())
	fmt.Println("ran", sent.Load(), "jobs,", failures.Load(), "failed")
	// Output: ran 10 jobs, 1 failed
}
