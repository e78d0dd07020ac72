package queue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

func newShaper(t *testing.T, rate shaper.Rate, opts ...shaper.Option) *shaper.Shaper {
	t.Helper()
	store := memstore.New()
	t.Cleanup(func() { _ = store.Close() })
	s, err := shaper.New(store, rate, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// router gives each key its own shaper: three contracts behind one Reserver.
func router(m map[string]shaper.Reserver) shaper.Reserver {
	return shaper.Route(func(key string) shaper.Reserver { return m[key] })
}

// starts records when, on clock, each key's jobs started.
type starts struct {
	clock *shapertest.Clock
	mu    sync.Mutex
	at    map[string][]time.Duration // since t0
}

func (s *starts) job(key string, run func()) Job {
	return Job{Key: key, Run: func(context.Context) error {
		s.mu.Lock()
		s.at[key] = append(s.at[key], s.clock.Now().Sub(t0))
		s.mu.Unlock()
		if run != nil {
			run()
		}
		return nil
	}}
}

// Three keys at different rates in one pool: each key's jobs start exactly
// at their slots, one interval apart, on the shaper's clock.
func TestThreeKeysKeepTheirRates(t *testing.T) {
	t.Parallel()
	clock := shapertest.NewClock(t0)
	r := router(map[string]shaper.Reserver{
		"a": fakeShaper(t, clock, shaper.PerSecond(20)),
		"b": fakeShaper(t, clock, shaper.PerSecond(10)),
		"c": fakeShaper(t, clock, shaper.PerSecond(5)),
	})
	q := New(r, WithWorkers(4))
	st := &starts{clock: clock, at: map[string][]time.Duration{}}
	for range 6 {
		for _, k := range []string{"a", "b", "c"} {
			if err := q.Submit(bg, st.job(k, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := closeDriving(t, q, clock); err != nil {
		t.Fatal(err)
	}
	for k, interval := range map[string]time.Duration{"a": 50 * time.Millisecond, "b": 100 * time.Millisecond, "c": 200 * time.Millisecond} {
		var want []time.Duration
		for i := range 6 {
			want = append(want, time.Duration(i)*interval)
		}
		if !slices.Equal(st.at[k], want) {
			t.Fatalf("key %s started at %v, want %v", k, st.at[k], want)
		}
	}
}

// A key paused for an hour does not delay another key's jobs, even with one
// worker: they start at their own slots. Close that gives up reports the
// paused key's job instead of dropping it.
func TestNoHeadOfLineBlocking(t *testing.T) {
	t.Parallel()
	clock := shapertest.NewClock(t0)
	s := fakeShaper(t, clock, shaper.PerSecond(100), shaper.WithMaxQueue(2*time.Hour))
	_ = s.Pause(bg, "slow", time.Hour)
	var errs []error
	var mu sync.Mutex
	q := New(s, WithWorkers(1), WithErrorHandler(func(_ Job, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }))
	st := &starts{clock: clock, at: map[string][]time.Duration{}}
	if err := q.Submit(bg, st.job("slow", nil)); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := q.Submit(bg, st.job("fast", nil)); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 { // to each fast slot, not to the slow one an hour away
		settle(t, q, clock)
		clock.Advance(10 * time.Millisecond)
	}
	settle(t, q, clock)
	if want := []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond, 40 * time.Millisecond}; !slices.Equal(st.at["fast"], want) {
		t.Fatalf("fast jobs started at %v behind a key paused for an hour, want %v", st.at["fast"], want)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := q.Close(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Close = %v", err)
	}
	if len(st.at["slow"]) != 0 || len(errs) != 1 || !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("after Close gave up: slow started at %v, errors %v; want the slow job reported as ErrClosed", st.at["slow"], errs)
	}
}

// Past MaxQueue, Submit fails at once with a QueueFullError and nothing
// runs; past MaxPending, ErrFull. The clock never moves while Submit runs:
// a Submit that waited for a slot would never return.
func TestBackpressure(t *testing.T) {
	t.Parallel()
	clock := shapertest.NewClock(t0)
	var runs atomic.Int32
	job := Job{Key: "k", Run: func(context.Context) error { runs.Add(1); return nil }}
	q := New(fakeShaper(t, clock, shaper.PerSecond(1), shaper.WithMaxQueue(100*time.Millisecond)))
	if err := q.Submit(bg, job); err != nil {
		t.Fatal(err)
	}
	var qf *shaper.QueueFullError
	if err := q.Submit(bg, job); !errors.As(err, &qf) || qf.Delay != time.Second {
		t.Fatalf("Submit past MaxQueue: %v, want a QueueFullError for a 1s wait", err)
	}
	if err := closeDriving(t, q, clock); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d jobs ran, want only the accepted one", runs.Load())
	}
	if err := q.Submit(bg, job); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	p := New(fakeShaper(t, clock, shaper.PerSecond(1), shaper.WithMaxQueue(time.Minute)), WithMaxPending(2))
	for i, want := range []error{nil, nil, nil, ErrFull} { // the first leaves at once; two wait; the fourth finds two pending
		if err := p.Submit(bg, job); !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Fatalf("submit %d: %v, want %v", i, err, want)
		}
		settle(t, p, clock)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	var ce *CloseError
	if err := p.Close(ctx); !errors.As(err, &ce) || ce.Withdrawn != 2 {
		t.Fatalf("Close: %v, want the two waiting jobs withdrawn", err)
	}
}

// Close drains: N accepted jobs, exactly N runs; when Close's ctx ends
// first, the jobs whose slots came ran and every other one is reported.
func TestCloseDrains(t *testing.T) {
	t.Parallel()
	for _, giveUp := range []bool{false, true} {
		clock := shapertest.NewClock(t0)
		var runs, reported atomic.Int32
		q := New(fakeShaper(t, clock, shaper.PerSecond(20)), WithErrorHandler(func(_ Job, err error) {
			if errors.Is(err, ErrClosed) {
				reported.Add(1)
			}
		}))
		const N = 30 // 1.45 s of slots at 20/s
		for range N {
			if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { runs.Add(1); return nil }}); err != nil {
				t.Fatal(err)
			}
		}
		if !giveUp {
			if err := closeDriving(t, q, clock); err != nil || runs.Load() != N || reported.Load() != 0 {
				t.Fatalf("Close = %v: %d ran and %d were reported, want all %d run", err, runs.Load(), reported.Load(), N)
			}
			continue
		}
		for range 6 { // the slots at 0, 50, ..., 300 ms come: 7 jobs
			settle(t, q, clock)
			clock.Advance(50 * time.Millisecond)
		}
		settle(t, q, clock)
		ctx, cancel := context.WithCancel(bg)
		cancel()
		if err := q.Close(ctx); !errors.Is(err, context.Canceled) || runs.Load() != 7 || reported.Load() != N-7 {
			t.Fatalf("Close = %v: %d ran and %d were reported, want 7 and %d", err, runs.Load(), reported.Load(), N-7)
		}
	}
}

// A submitted job whose ctx is cancelled before it starts never runs, is
// reported, and gives its slot back (the tail refund).
func TestCancelledJobFreesItsSlot(t *testing.T) {
	t.Parallel()
	clock := shapertest.NewClock(t0)
	s := fakeShaper(t, clock, shaper.PerSecond(1))
	var reported []error
	var mu sync.Mutex
	q := New(s, WithErrorHandler(func(_ Job, err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }))
	var runs atomic.Int32
	job := Job{Key: "k", Run: func(context.Context) error { runs.Add(1); return nil }}
	if err := q.Submit(bg, job); err != nil { // leaves at once
		t.Fatal(err)
	}
	// It has left the heap before the check of Pending below (it was
	// counted there while the dispatcher had not yet started it).
	until(t, "the first job to run", func() bool { return runs.Load() == 1 })
	ctx, cancel := context.WithCancel(bg)
	if err := q.Submit(ctx, job); err != nil { // slot 1 s away
		t.Fatal(err)
	}
	cancel()
	// The job is reported after its slot is given back; Pending drops to 0
	// before that, so it cannot be what the test waits for.
	until(t, "the cancelled job to be reported", func() bool { mu.Lock(); defer mu.Unlock(); return len(reported) == 1 })
	if q.Pending() != 0 {
		t.Fatalf("Pending = %d after the job was withdrawn, want 0", q.Pending())
	}
	r, err := s.Reserve(bg, "k", 1)
	if err != nil || r.Delay != time.Second {
		t.Fatalf("the next slot is %v away (%v); want the cancelled job's, 1s", r.Delay, err)
	}
	_ = r.Cancel(bg)
	if err := closeDriving(t, q, clock); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if runs.Load() != 1 || len(reported) != 1 || !errors.Is(reported[0], context.Canceled) {
		t.Fatalf("%d runs, reported %v; want 1 run and context.Canceled", runs.Load(), reported)
	}
}

// A panicking job is recovered and reported; the pool carries on. Do returns
// the job's own error.
func TestPanicsAreReportedAndDoReturnsTheError(t *testing.T) {
	t.Parallel()
	var panics atomic.Int32
	q := New(newShaper(t, shaper.PerSecond(1000)), WithWorkers(2), WithErrorHandler(func(_ Job, err error) {
		var pe *PanicError
		if errors.As(err, &pe) && pe.Value == "boom" && len(pe.Stack) > 0 {
			panics.Add(1)
		}
	}))
	for range 3 {
		if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { panic("boom") }}); err != nil {
			t.Fatal(err)
		}
	}
	mine := errors.New("mine")
	if err := q.Do(bg, Job{Key: "k", Run: func(context.Context) error { return mine }}); err != mine {
		t.Fatalf("Do = %v, want the job's own error", err)
	}
	if err := q.Do(bg, Job{Key: "k", Run: func(context.Context) error { panic("again") }}); err == nil {
		t.Fatal("Do of a panicking job returned nil")
	}
	if err := q.Close(bg); err != nil {
		t.Fatal(err)
	}
	if panics.Load() != 3 {
		t.Fatalf("%d panics reported, want 3", panics.Load())
	}
}

// Jobs of one key start in the order they were reserved.
func TestOneKeyStartsInOrder(t *testing.T) {
	t.Parallel()
	clock := shapertest.NewClock(t0)
	q := New(fakeShaper(t, clock, shaper.PerSecond(200)), WithWorkers(8))
	var mu sync.Mutex
	var order []int
	for i := range 40 {
		if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error {
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			return nil
		}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := closeDriving(t, q, clock); err != nil {
		t.Fatal(err)
	}
	if len(order) != 40 || !slices.IsSorted(order) {
		t.Fatalf("start order %v", order)
	}
}

// Wrap paces an existing consumer loop without the pool: messages are
// handled exactly at their slots on the shaper's clock.
func TestWrap(t *testing.T) {
	t.Parallel()
	clock := shapertest.NewClock(t0)
	s := fakeShaper(t, clock, shaper.PerSecond(20))
	var seen []time.Duration
	h := Wrap(s, func(m string) string { return m }, nil, func(_ context.Context, m string) error {
		seen = append(seen, clock.Now().Sub(t0))
		return nil
	})
	done := make(chan error, 1)
	go func() {
		for range 5 {
			if err := h(bg, "topic"); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 4 {
		if err := clock.WaitForTimers(bg, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(50 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(seen, want) {
		t.Fatalf("5 messages at 20/s handled at %v, want %v", seen, want)
	}
	// The key "other" is booked 100 ms ahead; a handler whose ctx ends in
	// 10 ms (real time: the ctx's deadline is on the system clock) is
	// refused at once with an error matching DeadlineExceeded.
	for range 3 {
		if _, err := s.Reserve(bg, "other", 1); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	if err := Wrap(s, func(m string) string { return "other" }, nil, func(context.Context, string) error { return nil })(ctx, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wrap past the deadline: %v", err)
	}
}
