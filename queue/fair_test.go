package queue

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

func fairShaper(t *testing.T) *shaper.Shaper {
	t.Helper()
	store := memstore.New(memstore.WithSweepInterval(0))
	t.Cleanup(func() { _ = store.Close() })
	s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Jobs submitted with a flow take turns: a tenant's 10 jobs submitted
// after another's 300 run within 2 s, alternating with them, though every
// worker could have been taken by the first tenant's jobs. No worker is
// held while a job waits for its turn.
func TestJobsOfAFlowTakeTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := fairShaper(t)
		q := New(s, WithWorkers(2))
		var mu sync.Mutex
		var ran []string
		job := func(tenant string) Job {
			return Job{Key: "partner", Run: func(context.Context) error {
				mu.Lock()
				ran = append(ran, tenant)
				mu.Unlock()
				return nil
			}}
		}
		a := shaper.WithFlow(bg, shaper.Flow{Name: "A"})
		for range 300 {
			if err := q.Submit(a, job("A")); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(5 * time.Second)
		if p := q.Pending(); p < 240 {
			t.Fatalf("Pending %d after 5 s of 300 jobs at 10/s", p)
		}
		b := shaper.WithFlow(bg, shaper.Flow{Name: "B"})
		for range 10 {
			if err := q.Submit(b, job("B")); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2100 * time.Millisecond)
		mu.Lock()
		var bs []int
		for i, who := range ran {
			if who == "B" {
				bs = append(bs, i)
			}
		}
		mu.Unlock()
		if len(bs) != 10 {
			t.Fatalf("%d of B's 10 jobs ran within 2.1 s of their submission", len(bs))
		}
		for i := 1; i < len(bs); i++ {
			if bs[i]-bs[i-1] != 2 {
				t.Fatalf("B's jobs ran at %v: not alternating with A's", bs)
			}
		}
		ctx, cancel := context.WithTimeout(bg, time.Second)
		defer cancel()
		var ce *CloseError
		if err := q.Close(ctx); !errors.As(err, &ce) || ce.Withdrawn < 200 {
			t.Fatalf("Close with about 220 jobs waiting: %v", err)
		}
		synctest.Wait()
		if p := q.Pending(); p != 0 {
			t.Fatalf("Pending %d after Close", p)
		}
	})
}

// A flow's jobs whose turn cannot come before MaxQueue are refused, and Do
// returns the refusal; one whose ctx ends while it waits reports ctx's
// error; Close drains the jobs still waiting for their turn.
func TestJobsOfAFlowRefusedCancelledDrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.WithSweepInterval(0))
		t.Cleanup(func() { _ = store.Close() })
		s, err := shaper.New(store, shaper.PerSecond(10), shaper.WithMaxQueue(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var errs []error
		q := New(s, WithErrorHandler(func(_ Job, err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}))
		a := shaper.WithFlow(bg, shaper.Flow{Name: "A"})
		var runs sync.WaitGroup
		for range 20 {
			runs.Add(1)
			if err := q.Submit(a, Job{Key: "k", Run: func(context.Context) error { runs.Done(); return nil }}); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		var qf *shaper.QueueFullError
		if err := q.Do(a, Job{Key: "k", Cost: 10, Run: func(context.Context) error { return nil }}); !errors.As(err, &qf) {
			t.Fatalf("a job whose turn is past MaxQueue: %v, want a *shaper.QueueFullError", err)
		}
		short, cancel := context.WithTimeout(a, 500*time.Millisecond)
		defer cancel()
		var de *shaper.DeadlineError
		if err := q.Do(short, Job{Key: "k", Run: func(context.Context) error { return nil }}); !errors.As(err, &de) {
			t.Fatalf("a job whose turn is past its deadline: %v, want a *shaper.DeadlineError", err)
		}
		gone, leave := context.WithCancel(a)
		time.AfterFunc(300*time.Millisecond, leave)
		if err := q.Do(gone, Job{Key: "k", Run: func(context.Context) error { return nil }}); !errors.Is(err, context.Canceled) {
			t.Fatalf("a job whose ctx ends while it waits for its turn: %v", err)
		}
		if err := q.Close(bg); err != nil {
			t.Fatal(err)
		}
		runs.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(errs) != 0 {
			t.Fatalf("the submitted jobs failed: %v", errs)
		}
	})
}
