// Package shapertest gives tests of code that uses ThrottleKit a clock they
// control, in the manner of net/http/httptest: pass a *Clock to
// shaper.WithClock, and a shaper's waits, and a queue's departures, happen
// when the test advances the clock, never in real time. A test of pacing then
// asserts exact delays and orders, and never sleeps.
//
//	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
//	s, _ := shaper.New(memstore.New(), shaper.PerSecond(2), shaper.WithClock(clock))
//	go func() { done <- s.Wait(ctx, "k", 1) }() // waits for a slot
//	clock.WaitForTimers(ctx, 1)                 // the waiter is asleep
//	clock.Advance(500 * time.Millisecond)       // its slot comes; Wait returns
//
// Advance does not wait for the goroutines it wakes (see Clock.Advance).
// Inside a testing/synctest bubble the system clock is fake as well, so a
// shaper on its default clock paces exactly there too, and synctest.Wait
// tells when every woken waiter has acted.
package shapertest

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// Clock is a shaper.Clock whose time moves only when the test says so. It
// keeps two clocks, as a host does: the wall clock that Now reads, and the
// elapsed time on which timers run. Advance moves both; Jump moves the wall
// clock alone, as a host suspend or a clock step does. It is safe for
// concurrent use.
type Clock struct{ f *timer.Fake }

var _ shaper.Clock = (*Clock)(nil)

// NewClock returns a clock whose wall clock reads start.
func NewClock(start time.Time) *Clock { return &Clock{f: timer.NewFake(start)} }

// Now returns the clock's wall time.
func (c *Clock) Now() time.Time { return c.f.Now() }

// NewTimer returns a timer that fires once the clock has been advanced by d;
// d <= 0 fires at once. Shapers and queues call it; tests rarely do.
func (c *Clock) NewTimer(d time.Duration) shaper.Timer { return c.f.NewTimer(d) }

// Advance moves the clock forward by d and fires, in deadline order, every
// timer that falls due, each seeing the clock at its own deadline. A
// negative d counts as zero.
//
// It returns once the timers are fired, not once the goroutines they wake
// have acted: a woken Wait returns concurrently with the test. Before
// moving the clock again, wait for what the waiter does next (its result,
// or WaitForTimers for its next sleep), or run the test in a
// testing/synctest bubble and call synctest.Wait, which returns once every
// goroutine of the bubble is blocked again:
//
//	clock.Advance(500 * time.Millisecond)
//	synctest.Wait() // the woken waiters have left, or sleep again
//	clock.Advance(500 * time.Millisecond)
//
// Otherwise a waiter woken by the first Advance may read the clock after
// the second and act as if it had woken then.
func (c *Clock) Advance(d time.Duration) { c.f.Advance(d) }

// Jump steps the wall clock by d, forwards or backwards, and fires nothing:
// a host suspend, a VM pause or a clock step as a process sees it.
func (c *Clock) Jump(d time.Duration) { c.f.Jump(d) }

// Timers returns how many timers are armed: goroutines asleep on the clock.
func (c *Clock) Timers() int { return c.f.Pending() }

// WaitForTimers blocks until at least n timers are armed, or ctx ends. Call
// it after starting a waiter and before Advance, so that the waiter is
// asleep when the time moves.
func (c *Clock) WaitForTimers(ctx context.Context, n int) error { return c.f.WaitForTimers(ctx, n) }
