package timer

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC)

// sleeper runs SleepUntil in a goroutine and reports its result and the wall
// clock it saw when it returned.
type result struct {
	err  error
	wall time.Time
}

func startSleeper(ctx context.Context, c *Fake, deadline time.Time, precise bool) <-chan result {
	out := make(chan result, 1)
	go func() {
		var err error
		if precise {
			err = SleepUntilPrecise(ctx, c, deadline, time.Millisecond)
		} else {
			err = SleepUntil(ctx, c, deadline)
		}
		out <- result{err, c.Now()}
	}()
	return out
}

func waitTimer(t *testing.T, c *Fake) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("sleeper never armed a timer: %v", err)
	}
}

func recv(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("sleeper did not return")
		return result{}
	}
}

func TestFortyDayDeadlineCompletesWhenClockReachesIt(t *testing.T) {
	t.Parallel()
	c := NewFake(t0)
	deadline := t0.Add(40*24*time.Hour + 30*time.Second)
	out := startSleeper(context.Background(), c, deadline, false)
	chunks := 0
	for {
		waitTimer(t, c)
		select {
		case r := <-out:
			t.Fatalf("returned early at %v (err %v)", r.wall, r.err)
		default:
		}
		c.Advance(min(MaxChunk, deadline.Sub(c.Now())))
		chunks++
		if !c.Now().Before(deadline) {
			break
		}
	}
	r := recv(t, out)
	if r.err != nil {
		t.Fatalf("err = %v", r.err)
	}
	if !r.wall.Equal(deadline) {
		t.Fatalf("returned at %v, want exactly the deadline %v", r.wall, deadline)
	}
	if want := 40*24*60 + 1; chunks != want {
		t.Fatalf("slept in %d chunks, want %d (chunks of at most %v)", chunks, want, MaxChunk)
	}
}

func TestSuspendEndsSleepAtNextChunk(t *testing.T) {
	t.Parallel()
	c := NewFake(t0)
	deadline := t0.Add(90 * time.Minute)
	out := startSleeper(context.Background(), c, deadline, false)
	waitTimer(t, c)
	c.Advance(10 * time.Second) // inside the first chunk
	c.Jump(2 * time.Hour)       // host suspended for two hours: no timer fires
	if c.Pending() != 1 {
		t.Fatalf("pending timers = %d, want 1", c.Pending())
	}
	c.Advance(MaxChunk - 10*time.Second) // the chunk ends on the monotonic clock
	r := recv(t, out)
	if r.err != nil {
		t.Fatalf("err = %v", r.err)
	}
	if got, want := r.wall.Sub(t0), 2*time.Hour+MaxChunk; got != want {
		t.Fatalf("woke %v after start, want %v (one chunk after the suspend, not a chunk per minute of the suspension)", got, want)
	}
}

func TestBackwardClockStepDoesNotWakeEarly(t *testing.T) {
	t.Parallel()
	c := NewFake(t0)
	deadline := t0.Add(2 * time.Minute)
	out := startSleeper(context.Background(), c, deadline, false)
	waitTimer(t, c)
	c.Jump(-time.Hour)
	for range 3 { // 3 chunks of monotonic time pass, but the wall clock is an hour behind
		c.Advance(MaxChunk)
		waitTimer(t, c)
	}
	select {
	case r := <-out:
		t.Fatalf("returned at wall %v before the wall deadline %v", r.wall, deadline)
	default:
	}
	c.Jump(time.Hour)
	c.Advance(MaxChunk)
	if r := recv(t, out); r.err != nil || r.wall.Before(deadline) {
		t.Fatalf("got %+v, want nil error at or after %v", r, deadline)
	}
}

func TestCancelReturnsAtOnceAndStopsTimer(t *testing.T) {
	t.Parallel()
	for _, precise := range []bool{false, true} {
		c := NewFake(t0)
		ctx, cancel := context.WithCancel(context.Background())
		out := startSleeper(ctx, c, t0.Add(40*24*time.Hour), precise)
		waitTimer(t, c)
		cancel()
		r := recv(t, out)
		if !errors.Is(r.err, context.Canceled) || r.err != context.Canceled {
			t.Fatalf("precise=%v: err = %v, want context.Canceled unchanged", precise, r.err)
		}
		if !r.wall.Equal(t0) {
			t.Fatalf("precise=%v: clock moved to %v", precise, r.wall)
		}
		if n := c.Pending(); n != 0 {
			t.Fatalf("precise=%v: %d timers left armed after cancel", precise, n)
		}
	}
}

func TestDeadlineExceededIsReturnedUnchanged(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(20*time.Millisecond))
	defer cancel()
	err := SleepUntil(ctx, Real(), time.Now().Add(time.Hour))
	if err != context.DeadlineExceeded {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
}

func TestDoneContextWinsOverPastDeadline(t *testing.T) {
	t.Parallel()
	c := NewFake(t0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := SleepUntil(ctx, c, t0.Add(-time.Second)); err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if err := SleepUntil(context.Background(), c, t0); err != nil {
		t.Fatalf("deadline == now: err = %v", err)
	}
	if c.Pending() != 0 {
		t.Fatal("a past deadline armed a timer")
	}
}

func TestPreciseFinishesAfterWindow(t *testing.T) {
	t.Parallel()
	c := NewFake(t0)
	deadline := t0.Add(10 * time.Millisecond)
	out := startSleeper(context.Background(), c, deadline, true)
	waitTimer(t, c)
	c.Advance(9 * time.Millisecond) // the timer covers all but the 1 ms window
	select {
	case r := <-out:
		t.Fatalf("returned inside the window at %v", r.wall)
	case <-time.After(20 * time.Millisecond):
	}
	c.Advance(time.Millisecond)
	if r := recv(t, out); r.err != nil || !r.wall.Equal(deadline) {
		t.Fatalf("got %+v, want nil at %v", r, deadline)
	}
}

func TestRealClockNeverWakesEarly(t *testing.T) {
	t.Parallel()
	for _, precise := range []bool{false, true} {
		for range 20 {
			deadline := time.Now().Add(3 * time.Millisecond)
			var err error
			if precise {
				err = SleepUntilPrecise(context.Background(), Real(), deadline, 0)
			} else {
				err = SleepUntil(context.Background(), Real(), deadline)
			}
			now := time.Now()
			if err != nil || now.Before(deadline) {
				t.Fatalf("precise=%v: err=%v, woke %v before the deadline", precise, err, deadline.Sub(now))
			}
		}
	}
}

func TestFakeTimersFireInOrder(t *testing.T) {
	t.Parallel()
	c := NewFake(t0)
	a, b, z := c.NewTimer(2*time.Second), c.NewTimer(time.Second), c.NewTimer(0)
	if got := <-z.C(); !got.Equal(t0) {
		t.Fatalf("zero timer fired at %v", got)
	}
	c.Advance(5 * time.Second)
	if got := <-b.C(); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("1 s timer fired at %v", got)
	}
	if got := <-a.C(); !got.Equal(t0.Add(2 * time.Second)) {
		t.Fatalf("2 s timer fired at %v", got)
	}
	if a.Stop() {
		t.Fatal("Stop of a fired timer reported true")
	}
	if !c.Now().Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("now = %v", c.Now())
	}
}
