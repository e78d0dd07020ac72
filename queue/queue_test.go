package queue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bg = context.Background()

func newShaper(t *testing.T, rate shaper.Rate, opts ...shaper.Option) *shaper.Shaper {
	t.Helper()
	store := shaper.NewMemoryStore()
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

// starts records when each key's jobs started.
type starts struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (s *starts) job(key string, run func()) Job {
	return Job{Key: key, Run: func(context.Context) error {
		s.mu.Lock()
		s.at[key] = append(s.at[key], time.Now())
		s.mu.Unlock()
		if run != nil {
			run()
		}
		return nil
	}}
}

// Three keys at different rates in one pool: each key's jobs start no closer
// together than half its interval. The slots are exactly one interval apart;
// a job that starts late (a goroutine woken late under -race on two loaded
// cores) shortens the gap after it by its lateness, so the slack is half an
// interval (25 ms and more), and the median gap must be the interval.
func TestThreeKeysKeepTheirRates(t *testing.T) {
	t.Parallel()
	r := router(map[string]shaper.Reserver{
		"a": newShaper(t, shaper.PerSecond(20)),
		"b": newShaper(t, shaper.PerSecond(10)),
		"c": newShaper(t, shaper.PerSecond(5)),
	})
	q := New(r, WithWorkers(4))
	st := &starts{at: map[string][]time.Time{}}
	for range 6 {
		for _, k := range []string{"a", "b", "c"} {
			if err := q.Submit(bg, st.job(k, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := q.Close(bg); err != nil {
		t.Fatal(err)
	}
	for k, interval := range map[string]time.Duration{"a": 50 * time.Millisecond, "b": 100 * time.Millisecond, "c": 200 * time.Millisecond} {
		ts := st.at[k]
		if len(ts) != 6 {
			t.Fatalf("key %s: %d jobs ran, want 6", k, len(ts))
		}
		var gaps []time.Duration
		for i := 1; i < len(ts); i++ {
			gap := ts[i].Sub(ts[i-1])
			if gap < interval/2 {
				t.Fatalf("key %s: jobs %d and %d started %v apart, want about %v", k, i-1, i, gap, interval)
			}
			gaps = append(gaps, gap)
		}
		slices.Sort(gaps)
		if med := gaps[len(gaps)/2]; med < interval*4/5 || med > interval*3/2 {
			t.Fatalf("key %s: median gap %v, want about %v", k, med, interval)
		}
	}
}

// A key paused for an hour does not delay another key's jobs; Close that
// gives up reports the paused key's job instead of dropping it.
func TestNoHeadOfLineBlocking(t *testing.T) {
	t.Parallel()
	s := newShaper(t, shaper.PerSecond(100), shaper.WithMaxQueue(2*time.Hour))
	_ = s.Pause(bg, "slow", time.Hour)
	var errs []error
	var mu sync.Mutex
	q := New(s, WithWorkers(1), WithErrorHandler(func(_ Job, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }))
	ran := make(chan string, 10)
	slow := Job{Key: "slow", Run: func(context.Context) error { ran <- "slow"; return nil }}
	if err := q.Submit(bg, slow); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 5 {
		if err := q.Submit(bg, Job{Key: "fast", Run: func(context.Context) error { ran <- "fast"; return nil }}); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		if k := <-ran; k != "fast" {
			t.Fatalf("%s ran", k)
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("5 fast jobs at 100/s took %v behind a key paused for an hour", took)
	}
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	if err := q.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v", err)
	}
	if len(ran) != 0 || len(errs) != 1 || !errors.Is(errs[0], ErrClosed) {
		t.Fatalf("after Close gave up: %d ran, errors %v; want the slow job reported as ErrClosed", len(ran), errs)
	}
}

// Past MaxQueue, Submit fails at once with a QueueFullError and nothing runs;
// past MaxPending, ErrFull.
func TestBackpressure(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	job := Job{Key: "k", Run: func(context.Context) error { runs.Add(1); return nil }}
	q := New(newShaper(t, shaper.PerSecond(1), shaper.WithMaxQueue(100*time.Millisecond)))
	if err := q.Submit(bg, job); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := q.Submit(bg, job)
	var qf *shaper.QueueFullError
	// "At once": well under the 1 s the slot was away (500 ms leaves room for
	// a loaded -race run).
	if !errors.As(err, &qf) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("Submit past MaxQueue: %v after %v, want a QueueFullError at once", err, time.Since(start))
	}
	if err := q.Close(bg); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d jobs ran, want only the accepted one", runs.Load())
	}
	if err := q.Submit(bg, job); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	p := New(newShaper(t, shaper.PerSecond(1), shaper.WithMaxQueue(time.Minute)), WithMaxPending(2))
	for i, want := range []error{nil, nil, nil, ErrFull} { // the first leaves at once; two wait; the fourth finds two pending
		if err := p.Submit(bg, job); !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Fatalf("submit %d: %v, want %v", i, err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	_ = p.Close(ctx)
}

// Close drains: N accepted jobs, exactly N runs; when Close's ctx ends first,
// runs plus reported errors still make N.
func TestCloseDrains(t *testing.T) {
	t.Parallel()
	for _, giveUp := range []bool{false, true} {
		var runs, reported atomic.Int32
		q := New(newShaper(t, shaper.PerSecond(20)), WithErrorHandler(func(_ Job, err error) {
			if errors.Is(err, ErrClosed) {
				reported.Add(1)
			}
		}))
		const N = 30 // 1.5 s of work at 20/s
		for range N {
			if err := q.Submit(bg, Job{Key: "k", Run: func(context.Context) error { runs.Add(1); return nil }}); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(bg)
		if giveUp {
			ctx, cancel = context.WithTimeout(bg, 300*time.Millisecond)
		}
		err := q.Close(ctx)
		cancel()
		if giveUp != errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("giveUp=%v: Close = %v", giveUp, err)
		}
		if got := runs.Load() + reported.Load(); got != N || (!giveUp && runs.Load() != N) || (giveUp && reported.Load() == 0) {
			t.Fatalf("giveUp=%v: %d ran and %d were reported, want %d in all", giveUp, runs.Load(), reported.Load(), N)
		}
	}
}

// A submitted job whose ctx is cancelled before it starts never runs, is
// reported, and gives its slot back (the tail refund).
func TestCancelledJobFreesItsSlot(t *testing.T) {
	t.Parallel()
	s := newShaper(t, shaper.PerSecond(1))
	var reported []error
	var mu sync.Mutex
	q := New(s, WithErrorHandler(func(_ Job, err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }))
	var runs atomic.Int32
	job := Job{Key: "k", Run: func(context.Context) error { runs.Add(1); return nil }}
	if err := q.Submit(bg, job); err != nil { // leaves at once
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	if err := q.Submit(ctx, job); err != nil { // slot 1 s away
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for q.Pending() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	r, err := s.Reserve(bg, "k", 1)
	if err != nil || r.Delay > time.Second || r.Delay < 900*time.Millisecond {
		t.Fatalf("the next slot is %v away (%v); want the cancelled job's, about 1s", r.Delay, err)
	}
	_ = r.Cancel(bg)
	if err := q.Close(bg); err != nil {
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
	q := New(newShaper(t, shaper.PerSecond(200)), WithWorkers(8))
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
	if err := q.Close(bg); err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(order) {
		t.Fatalf("start order %v", order)
	}
}

// Wrap paces an existing consumer loop without the pool.
func TestWrap(t *testing.T) {
	t.Parallel()
	s := newShaper(t, shaper.PerSecond(20))
	var seen []time.Time
	h := Wrap(s, func(m string) string { return m }, nil, func(_ context.Context, m string) error {
		seen = append(seen, time.Now())
		return nil
	})
	for range 5 {
		if err := h(bg, "topic"); err != nil {
			t.Fatal(err)
		}
	}
	if span := seen[4].Sub(seen[0]); span < 190*time.Millisecond {
		t.Fatalf("5 messages at 20/s took %v, want >= 200ms", span)
	}
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	for range 3 {
		_ = s.Wait(bg, "other", 1)
	}
	if err := Wrap(s, func(m string) string { return "other" }, nil, func(context.Context, string) error { return nil })(ctx, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wrap past the deadline: %v", err)
	}
}
