package timer

import (
	"context"
	"runtime"
	"time"
)

// MaxChunk is the longest single timer SleepUntil arms before it re-reads the
// wall clock. It bounds the oversleep caused by a host suspend or a clock step.
const MaxChunk = time.Minute

// DefaultPreciseWindow is the window before the deadline in which
// SleepUntilPrecise stops trusting the timer and yields instead. It covers the
// Go timer's typical wake-up latency on Linux (about a millisecond) with margin.
const DefaultPreciseWindow = 2 * time.Millisecond

// SleepUntil blocks until the wall clock of c reads deadline or later, or ctx
// ends. It returns nil when the deadline is reached and ctx.Err() (unchanged)
// when ctx ends first; a ctx that is already done returns its error at once,
// even if the deadline has passed.
//
// It sleeps in chunks of at most [MaxChunk] and compares wall-clock readings
// (monotonic readings are stripped), so a suspend or a clock step is noticed at
// the next chunk.
func SleepUntil(ctx context.Context, c Clock, deadline time.Time) error {
	return sleepUntil(ctx, c, deadline, 0)
}

// SleepUntilPrecise is [SleepUntil] with a busy-yield finish: it sleeps on
// timers until window before the deadline, then calls runtime.Gosched in a loop,
// re-reading the clock, until the deadline passes. It wakes within microseconds
// of the deadline at the cost of up to window of CPU per call. A window <= 0
// means [DefaultPreciseWindow].
func SleepUntilPrecise(ctx context.Context, c Clock, deadline time.Time, window time.Duration) error {
	if window <= 0 {
		window = DefaultPreciseWindow
	}
	return sleepUntil(ctx, c, deadline, window)
}

func sleepUntil(ctx context.Context, c Clock, deadline time.Time, window time.Duration) error {
	deadline = deadline.Round(0)
	done := ctx.Done()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		remaining := deadline.Sub(wallNow(c))
		if remaining <= 0 {
			return nil
		}
		if remaining <= window {
			runtime.Gosched()
			continue
		}
		d := min(remaining-window, MaxChunk)
		t := c.NewTimer(d)
		select {
		case <-done:
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}

// wallNow reads c's wall clock without its monotonic reading. For the real
// clock it calls time.Now, not the anchored Now: the monotonic clock stops
// while the host is suspended, and the wall clock is what tells a chunked
// sleep that the time has come.
func wallNow(c Clock) time.Time {
	if _, ok := c.(realClock); ok {
		return time.Now().Round(0)
	}
	return c.Now().Round(0)
}
