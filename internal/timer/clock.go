package timer

import "time"

// Clock is the seam through which ThrottleKit reads the time and arms timers.
// Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that delivers the time on its channel once d
	// has elapsed on this clock.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer created by a [Clock].
type Timer interface {
	// C returns the channel on which the timer delivers its firing time.
	C() <-chan time.Time
	// Stop prevents the timer from firing. It reports whether the timer was
	// still pending.
	Stop() bool
}

// Real returns the system clock: time.Now and time.NewTimer.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }
