package queue

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
)

// t0 is where every fake clock of these tests starts.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeShaper returns a shaper on a fresh memory store, on clock.
func fakeShaper(t *testing.T, clock *shapertest.Clock, rate shaper.Rate, opts ...shaper.Option) *shaper.Shaper {
	t.Helper()
	return newShaper(t, rate, append([]shaper.Option{shaper.WithClock(clock)}, opts...)...)
}

// hangGuard bounds a wait for something that must happen: it fails a test
// that would otherwise hang. It is never a bound on how fast anything is.
const hangGuard = 10 * time.Second

// until spins until cond holds, and fails the test after hangGuard.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", hangGuard, what)
		}
		runtime.Gosched()
		time.Sleep(50 * time.Microsecond)
	}
}

// settle waits until q's dispatcher is asleep on clock with nothing due
// (a timer armed and no nudge unread) or has nothing pending, and no job is
// running: moving the clock next cannot race the dispatcher's reading of it
// or a job's.
func settle(t *testing.T, q *Queue, clock *shapertest.Clock) {
	t.Helper()
	until(t, "the queue to settle", func() bool {
		q.mu.Lock()
		n := q.pending.Len()
		q.mu.Unlock()
		return len(q.wake) == 0 && (n == 0 || clock.Timers() > 0) && q.nrun.Load() == 0
	})
}

// drive moves clock from one pending departure to the next, exactly to
// each, until no job is pending or running: every job starts at its slot,
// on the clock, and a test reads its start times exactly.
func drive(t *testing.T, q *Queue, clock *shapertest.Clock) {
	t.Helper()
	for {
		settle(t, q, clock)
		q.mu.Lock()
		if q.pending.Len() == 0 {
			q.mu.Unlock()
			return
		}
		next := q.pending[0].at
		q.mu.Unlock()
		clock.Advance(next.Sub(clock.Now()))
	}
}

// closeDriving closes q while driving its clock, and returns Close's error.
func closeDriving(t *testing.T, q *Queue, clock *shapertest.Clock) error {
	t.Helper()
	drive(t, q, clock)
	return q.Close(context.Background())
}
