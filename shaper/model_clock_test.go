package shaper_test

import (
	"sync"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// warpClock is the model test's shaper.Clock: real time plus an offset that
// only grows. A timer of d > 0 advances the offset by d at once (a warp) and
// has already fired, so Wait and Acquire never sleep in real time in a
// sequential test, and the test itself moves time with Advance. Real time
// keeps flowing underneath, so the clock never goes backwards and a Redis
// key's real expiry is never ahead of the clock.
//
// Every warp of d calls onWarp(d), which models key expiry on the warped
// timeline: on Redis it shortens every TTL by d (and deletes the keys whose
// TTL d covers), so that a key set on this clock (WithClientClock) expires at
// the clock's instant its TTL names, never earlier.
//
// While recording, the clock keeps every reading it hands out and the target
// instant of every timer (the reading the timer was armed from, plus its
// duration): the model reads from them the instant a call that returns no
// Reservation (Allow, Wait) was decided at and departed on.
type warpClock struct {
	mu     sync.Mutex
	base   time.Time // a wall-clock instant, no monotonic reading
	start  time.Time // the monotonic anchor of base
	offset time.Duration
	last   time.Time // the latest reading handed out

	rec    bool
	events []clockEvent

	hookMu sync.Mutex // warps' expiry models run one at a time, in order
	onWarp func(d time.Duration)
}

func newWarpClock() *warpClock {
	now := time.Now()
	return &warpClock{base: now.Round(0), start: now}
}

var _ shaper.Clock = (*warpClock)(nil)

// Now returns real time plus the offset; never less than a reading already
// handed out.
func (c *warpClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nowLocked()
}

func (c *warpClock) nowLocked() time.Time {
	t := c.base.Add(time.Since(c.start) + c.offset)
	if t.Before(c.last) {
		t = c.last
	}
	c.last = t
	if c.rec {
		c.events = append(c.events, clockEvent{at: t})
	}
	return t
}

// clockEvent is a reading handed out, or a timer armed (timer: at is its
// target, the reading before it plus its duration).
type clockEvent struct {
	at    time.Time
	timer bool
}

// NewTimer warps the clock by d (d > 0) and returns a timer that has fired.
func (c *warpClock) NewTimer(d time.Duration) shaper.Timer {
	t := &firedTimer{ch: make(chan time.Time, 1)}
	if d > 0 {
		c.mu.Lock()
		if c.rec {
			c.events = append(c.events, clockEvent{at: c.last.Add(d), timer: true})
		}
		c.mu.Unlock()
		c.warp(d)
	}
	t.ch <- c.Now()
	return t
}

// Advance moves the clock forward by d, as a timer of d does.
func (c *warpClock) Advance(d time.Duration) {
	if d > 0 {
		c.warp(d)
	}
}

func (c *warpClock) warp(d time.Duration) {
	c.hookMu.Lock()
	defer c.hookMu.Unlock()
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
	if c.onWarp != nil {
		c.onWarp(d)
	}
}

// record starts keeping readings and timer targets (clearing earlier ones).
func (c *warpClock) record() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec, c.events = true, nil
}

// stop stops recording and returns what was kept, in order.
func (c *warpClock) stop() []clockEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rec = false
	return c.events
}

type firedTimer struct{ ch chan time.Time }

func (t *firedTimer) C() <-chan time.Time { return t.ch }
func (t *firedTimer) Stop() bool          { return false }
