package queue

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// slowReserver is a store that takes 2 ms per reservation, as a Redis round
// trip does under load.
type slowReserver struct{ shaper.Reserver }

func (s slowReserver) Reserve(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	time.Sleep(2 * time.Millisecond)
	return s.Reserver.Reserve(ctx, key, cost)
}

// WithMaxPending holds under any concurrency: 200 Submits at once behind a
// store that takes 2 ms accept exactly the cap. (It used to check before
// reserving and push after: 64 accepted with a cap of 5, 199 pending.)
func TestMaxPendingHoldsUnderConcurrentSubmit(t *testing.T) {
	t.Parallel()
	const limit = 5
	s := newShaper(t, shaper.PerMinute(1), shaper.WithMaxQueue(time.Hour))
	if _, err := s.Reserve(context.Background(), "k", 1); err != nil { // every job below waits
		t.Fatal(err)
	}
	q := New(slowReserver{s}, WithMaxPending(limit))
	var accepted, full atomic.Int64
	var most atomic.Int64
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			err := q.Submit(context.Background(), Job{Key: "k", Run: func(context.Context) error { return nil }})
			switch {
			case err == nil:
				accepted.Add(1)
			case errors.Is(err, ErrFull):
				full.Add(1)
			default:
				t.Error(err)
			}
			if p := int64(q.Pending()); p > most.Load() {
				most.Store(p)
			}
		})
	}
	wg.Wait()
	if accepted.Load() != limit || q.Pending() != limit || most.Load() > limit {
		t.Fatalf("cap %d: %d accepted, %d refused with ErrFull, %d pending (at most %d seen)", limit, accepted.Load(), full.Load(), q.Pending(), most.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var ce *CloseError
	if err := q.Close(ctx); !errors.As(err, &ce) || ce.Withdrawn != limit || ce.Running != 0 {
		t.Fatalf("Close: %v, want %d withdrawn, none running", err, limit)
	}
}

// Close returns when its ctx ends, whatever the running jobs do: it cancels
// their ctx (cause ErrClosed) and says how many were still running. A job
// that honours its ctx returns; one that ignores it keeps running and
// reports its own result later. (Close used to wait for running jobs past
// its ctx, forever, without cancelling them.)
func TestCloseReturnsWhenItsCtxEnds(t *testing.T) {
	t.Parallel()
	q := New(newShaper(t, shaper.PerSecond(1000)), WithWorkers(4))
	started := make(chan struct{}, 2)
	release := make(chan struct{})
	var cause atomic.Value
	honours := make(chan error, 1)
	go func() {
		honours <- q.Do(context.Background(), Job{Key: "a", Run: func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			cause.Store(context.Cause(ctx))
			return ctx.Err()
		}})
	}()
	ignores := make(chan error, 1)
	go func() {
		ignores <- q.Do(context.Background(), Job{Key: "b", Run: func(context.Context) error {
			started <- struct{}{}
			<-release
			return nil
		}})
	}()
	<-started
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	begin := time.Now()
	err := q.Close(ctx)
	// Generous: Close must return at its ctx's end, not after the jobs; 5 s
	// would mean it waited for the job that ignores its ctx (which never
	// returns until released below).
	if took := time.Since(begin); took > 5*time.Second {
		t.Fatalf("Close took %v past a 100 ms ctx", took)
	}
	var ce *CloseError
	if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) || ce.Running < 1 || ce.Running > 2 {
		t.Fatalf("Close: %v, want a *CloseError matching DeadlineExceeded with 1 or 2 running", err)
	}
	if err := <-honours; !errors.Is(err, context.Canceled) {
		t.Fatalf("the job that honours its ctx returned %v", err)
	}
	if c, _ := cause.Load().(error); !errors.Is(c, ErrClosed) {
		t.Fatalf("the running job's ctx was cancelled with cause %v, want ErrClosed", c)
	}
	close(release)
	if err := <-ignores; err != nil {
		t.Fatalf("the job that ignored its ctx reported %v", err)
	}
}

// A job that calls runtime.Goexit is reported like a panic, to Do and to
// the error handler, and the pool lives on. (Do used to hang.)
func TestGoexitIsReportedLikeAPanic(t *testing.T) {
	t.Parallel()
	reported := make(chan error, 1)
	q := New(newShaper(t, shaper.PerSecond(1000)), WithWorkers(1), WithErrorHandler(func(_ Job, err error) { reported <- err }))
	defer func() { _ = q.Close(context.Background()) }()
	done := make(chan error, 1)
	go func() {
		done <- q.Do(context.Background(), Job{Key: "k", Run: func(context.Context) error { runtime.Goexit(); return nil }})
	}()
	var pe *PanicError
	select {
	case err := <-done:
		if !errors.As(err, &pe) || !pe.Goexit {
			t.Fatalf("Do of a job that called Goexit: %v, want a *PanicError with Goexit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Do hung on a job that called runtime.Goexit")
	}
	if err := q.Submit(context.Background(), Job{Key: "k", Run: func(context.Context) error { runtime.Goexit(); return nil }}); err != nil {
		t.Fatal(err)
	}
	if err := <-reported; !errors.As(err, &pe) || !pe.Goexit {
		t.Fatalf("the error handler got %v", err)
	}
	if err := q.Do(context.Background(), Job{Key: "k", Run: func(context.Context) error { return nil }}); err != nil {
		t.Fatalf("the pool after two Goexits: %v", err)
	}
}

// A Route whose pick misses (a nil *Shaper from a map) refuses the job with
// a typed error; it used to panic in Submit.
func TestSubmitThroughARouteToANilShaper(t *testing.T) {
	t.Parallel()
	shapers := map[string]*shaper.Shaper{}
	q := New(shaper.Route(func(key string) shaper.Reserver { return shapers[key] }))
	defer func() { _ = q.Close(context.Background()) }()
	if err := q.Submit(context.Background(), Job{Key: "nobody", Run: func(context.Context) error { return nil }}); !errors.Is(err, shaper.ErrInvalidKey) {
		t.Fatalf("Submit through a missed route: %v, want a *KeyError", err)
	}
}

// delayOnly is a Reserver of the caller's own that grants every request a
// slot an hour away, as a Reservation with Delay alone.
type delayOnly struct{ shaper.Reserver }

func (delayOnly) Reserve(context.Context, string, int64) (shaper.Reservation, error) {
	return shaper.Reservation{Delay: time.Hour}, nil
}

// A Reservation that no shaper granted departs Delay after it was made: the
// queue holds the job (it used to take the zero time plus Delay for its slot
// and run the job at once).
func TestAReservationOfACustomReserverKeepsItsDelay(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	q := New(delayOnly{})
	if err := q.Submit(context.Background(), Job{Key: "k", Run: func(context.Context) error { runs.Add(1); return nil }}); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	pending, ahead := q.pending.Len(), time.Duration(0)
	if pending == 1 {
		ahead = time.Until(q.pending[0].at)
	}
	q.mu.Unlock()
	if pending != 1 || ahead < 59*time.Minute {
		t.Fatalf("%d jobs pending, the first %v ahead; want the job pending an hour ahead", pending, ahead)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var ce *CloseError
	if err := q.Close(ctx); !errors.As(err, &ce) || ce.Withdrawn != 1 || runs.Load() != 0 {
		t.Fatalf("Close: %v after %d runs; want the job an hour away withdrawn, never run", err, runs.Load())
	}
}
