package queue

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// permitShaper returns, in a synctest bubble (whose clock the shaper's
// default one is), a shaper on a fresh memory store with a rate and an
// in-flight dimension "open" of n permits.
func permitShaper(t *testing.T, n int64, rate shaper.Rate) *shaper.Shaper {
	t.Helper()
	store := memstore.New(memstore.WithSweepInterval(0))
	t.Cleanup(func() { _ = store.Close() })
	s, err := shaper.All(store, []shaper.Dimension{{Name: "rate", Rate: rate}, {Name: "open", InFlight: n}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// permits returns the permits held on key and its waiters.
func permits(t *testing.T, s *shaper.Shaper, key string) (held int64, waiting int) {
	t.Helper()
	st, err := s.Status(bg, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range st.Dimensions {
		if d.Name == "open" {
			return d.InFlight, d.Waiting
		}
	}
	t.Fatalf("no in-flight dimension in %+v", st)
	return 0, 0
}

func wantNoPermits(t *testing.T, s *shaper.Shaper, key, when string) {
	t.Helper()
	if held, waiting := permits(t, s, key); held != 0 || waiting != 0 {
		t.Fatalf("%s: %d permits held, %d waiting; want none", when, held, waiting)
	}
}

// gauge counts what runs at once, and the most that ever did.
type gauge struct{ now, most, total atomic.Int64 }

func (g *gauge) enter() {
	n := g.now.Add(1)
	g.total.Add(1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
}

func (g *gauge) leave() { g.now.Add(-1) }

// A pool of 10 workers over InFlight 3: Submit accepts every job at once,
// though the permits are all held; never more than 3 jobs run at once;
// every job runs; no permit is held after. Through Route too.
func TestAPoolOverInFlightRunsAtMostItsPermits(t *testing.T) {
	for _, routed := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			s := permitShaper(t, 3, shaper.PerSecond(1000))
			var r shaper.Reserver = s
			if routed {
				r = router(map[string]shaper.Reserver{"k": s})
			}
			var errs []error
			var mu sync.Mutex
			q := New(r, WithWorkers(10), WithErrorHandler(func(_ Job, err error) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}))
			var g gauge
			for range 30 {
				err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error {
					g.enter()
					defer g.leave()
					time.Sleep(10 * time.Millisecond)
					return nil
				}})
				if err != nil {
					t.Fatalf("Submit with every permit held: %v", err)
				}
			}
			synctest.Wait()
			if held, waiting := permits(t, s, "k"); held != 3 || waiting != 7 {
				t.Fatalf("mid-run: %d permits held, %d workers waiting for one; want 3 and 7", held, waiting)
			}
			if err := q.Close(bg); err != nil {
				t.Fatal(err)
			}
			if g.most.Load() != 3 || g.total.Load() != 30 || len(errs) != 0 {
				t.Fatalf("%d jobs ran, at most %d at once (want 30, 3); errors %v", g.total.Load(), g.most.Load(), errs)
			}
			wantNoPermits(t, s, "k", "after Close")
		})
	}
}

// A job that panics, or calls runtime.Goexit, releases its permit: on
// InFlight 1 the next job runs.
func TestAPanickingJobReleasesItsPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := permitShaper(t, 1, shaper.PerSecond(1000))
		q := New(s, WithWorkers(4))
		var pe *PanicError
		if err := q.Do(bg, Job{Key: "k", Run: func(context.Context) error { panic("boom") }}); !errors.As(err, &pe) || pe.Value != "boom" {
			t.Fatalf("Do of a panicking job: %v", err)
		}
		wantNoPermits(t, s, "k", "after the panic")
		if err := q.Do(bg, Job{Key: "k", Run: func(context.Context) error { runtime.Goexit(); return nil }}); !errors.As(err, &pe) || !pe.Goexit {
			t.Fatalf("Do of a job calling Goexit: %v", err)
		}
		wantNoPermits(t, s, "k", "after the Goexit")
		ran := false
		if err := q.Do(bg, Job{Key: "k", Run: func(context.Context) error { ran = true; return nil }}); err != nil || !ran {
			t.Fatalf("the next job: ran %v, %v", ran, err)
		}
		if err := q.Close(bg); err != nil {
			t.Fatal(err)
		}
		wantNoPermits(t, s, "k", "after Close")
	})
}

// While the one permit is held, Submit still accepts (it does not reserve):
// WithMaxPending counts the jobs waiting for a worker, and ErrClosed
// applies after Close. A job whose ctx ends while its worker waits for the
// permit does not run and reports ctx.Err(); Close giving up on a job
// waiting for its permit reports ErrClosed for it and counts it running.
func TestSubmitOnAPermitShaper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := permitShaper(t, 1, shaper.PerSecond(1000))
		reported := make(chan error, 10)
		q := New(s, WithWorkers(2), WithMaxPending(1), WithErrorHandler(func(_ Job, err error) { reported <- err }))
		holdIt := make(chan struct{})
		if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { <-holdIt; return nil }}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // it runs, holding the permit and a worker
		ctx, cancel := context.WithCancel(bg)
		ran := false
		if err := q.Submit(ctx, Job{Key: "k", Run: func(context.Context) error { ran = true; return nil }}); err != nil {
			t.Fatalf("Submit with the permit held: %v", err)
		}
		synctest.Wait() // the second worker waits for the permit
		if held, waiting := permits(t, s, "k"); held != 1 || waiting != 1 {
			t.Fatalf("%d held, %d waiting; want 1 and 1", held, waiting)
		}
		third, fourth := make(chan struct{}), make(chan struct{})
		if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { close(third); return nil }}); err != nil {
			t.Fatalf("Submit with a worker free to queue it on: %v", err)
		}
		// The dispatcher takes the third job, due at once, out of the
		// pending jobs, and waits for a worker with it (before this Wait it
		// may or may not have: the test waits for it, so as to count the
		// pending jobs once it has).
		synctest.Wait()
		if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { close(fourth); return nil }}); err != nil {
			t.Fatalf("Submit of a fourth job, the dispatcher holding the third: %v", err)
		}
		if q.Pending() != 1 {
			t.Fatalf("%d pending, want the fourth job, behind the third that waits for a worker", q.Pending())
		}
		if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { return nil }}); !errors.Is(err, ErrFull) {
			t.Fatalf("Submit past WithMaxPending: %v, want ErrFull", err)
		}
		cancel() // the second gives up its wait
		if err := <-reported; !errors.Is(err, context.Canceled) || ran {
			t.Fatalf("the job whose ctx ended waiting for its permit: ran %v, reported %v", ran, err)
		}
		synctest.Wait() // the third takes the freed worker and waits for the permit; the fourth waits for a worker
		if held, waiting := permits(t, s, "k"); held != 1 || waiting != 1 || q.Pending() != 0 {
			t.Fatalf("%d held, %d waiting, %d pending; want 1, 1, 0", held, waiting, q.Pending())
		}
		closeCtx, stop := context.WithTimeout(bg, time.Second)
		defer stop()
		var ce *CloseError
		// Running counts the first job (it ignores its ctx) and, unless it
		// has already returned, the third: giving up cancels its wait for
		// the permit at once, so it may report before Close counts.
		if err := q.Close(closeCtx); !errors.As(err, &ce) || ce.Running < 1 || ce.Running > 2 || ce.Withdrawn != 1 {
			t.Fatalf("Close: %v, want the first job running (and perhaps the third, waiting for its permit) and 1 withdrawn (waiting for a worker)", err)
		}
		for range 2 { // the third and the fourth
			if err := <-reported; !errors.Is(err, ErrClosed) {
				t.Fatalf("a job waiting for its permit or a worker when Close gave up reported %v, want ErrClosed", err)
			}
		}
		select {
		case <-third:
			t.Fatal("the job waiting for its permit ran after Close gave up")
		case <-fourth:
			t.Fatal("the job waiting for a worker ran after Close gave up")
		default:
		}
		if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { return nil }}); !errors.Is(err, ErrClosed) {
			t.Fatalf("Submit after Close: %v, want ErrClosed", err)
		}
		close(holdIt)
		synctest.Wait()
		wantNoPermits(t, s, "k", "after the last job returned")
	})
}

// reserveOnly holds permits (it forwards HoldsPermits) but has no Acquire.
type reserveOnly struct{ s *shaper.Shaper }

func (r reserveOnly) Reserve(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	return r.s.Reserve(ctx, key, cost)
}
func (r reserveOnly) Wait(ctx context.Context, key string, cost int64) error {
	return r.s.Wait(ctx, key, cost)
}
func (r reserveOnly) Pause(ctx context.Context, key string, d time.Duration) error {
	return r.s.Pause(ctx, key, d)
}
func (r reserveOnly) HoldsPermits(key string) bool { return r.s.HoldsPermits(key) }

// A Reserver that holds permits without Acquire cannot wait for one:
// Submit, Do and Wrap's handler fail with a *shaper.ConfigError and run
// nothing.
func TestPermitsWithoutAcquireAreAConfigError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := permitShaper(t, 1, shaper.PerSecond(1000))
		q := New(reserveOnly{s})
		ran := false
		job := Job{Key: "k", Run: func(context.Context) error { ran = true; return nil }}
		var ce *shaper.ConfigError
		if err := q.Submit(bg, job); !errors.As(err, &ce) {
			t.Fatalf("Submit: %v, want a *shaper.ConfigError", err)
		}
		if err := q.Do(bg, job); !errors.As(err, &ce) {
			t.Fatalf("Do: %v, want a *shaper.ConfigError", err)
		}
		h := Wrap(reserveOnly{s}, func(string) string { return "k" }, nil, func(context.Context, string) error { ran = true; return nil })
		if err := h(bg, "m"); !errors.As(err, &ce) {
			t.Fatalf("Wrap: %v, want a *shaper.ConfigError", err)
		}
		if ran {
			t.Fatal("a job ran")
		}
		if err := q.Close(bg); err != nil {
			t.Fatal(err)
		}
		wantNoPermits(t, s, "k", "at the end")
	})
}

// Wrap over InFlight 3, called by 10 consumers at once: at most 3 handlers
// run at once, every message is handled, a panicking handler releases its
// permit, and none is held after.
func TestWrapOverInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := permitShaper(t, 3, shaper.PerSecond(1000))
		var g gauge
		h := Wrap(s, func(m int) string { return "k" }, nil, func(_ context.Context, m int) error {
			g.enter()
			defer g.leave()
			time.Sleep(10 * time.Millisecond)
			if m == 7 {
				panic("bad message")
			}
			return nil
		})
		var wg sync.WaitGroup
		for c := range 10 {
			wg.Go(func() {
				for i := range 3 {
					func() {
						defer func() {
							if v := recover(); v != nil && v != "bad message" {
								t.Error(v)
							}
						}()
						if err := h(bg, c*3+i); err != nil {
							t.Error(err)
						}
					}()
				}
			})
		}
		wg.Wait()
		if g.most.Load() != 3 || g.total.Load() != 30 {
			t.Fatalf("%d messages handled, at most %d at once; want 30, 3", g.total.Load(), g.most.Load())
		}
		wantNoPermits(t, s, "k", "after every handler returned")
	})
}
