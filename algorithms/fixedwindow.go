package algorithms

import (
	"math"
	"time"
)

// FixedWindow admits up to Limit units per window of length Window, windows
// aligned to the Unix epoch (a one-minute window starts on each whole minute
// UTC). It is the cheapest algorithm and the least smooth: up to 2*Limit units
// can pass within one window length when one window's quota is spent at its end
// and the next window's at its start (see the tests). Use it where the partner
// counts in the same aligned windows.
//
// A clock that steps back into an earlier window keeps counting in the window
// it has stored, so it never over-admits.
//
// State layout: [window start (ms), count].
type FixedWindow struct {
	limited
	window float64 // ms
}

// NewFixedWindow returns a fixed window of limit units per window.
func NewFixedWindow(limit float64, window time.Duration) (*FixedWindow, error) {
	if err := validateLimit("fixed-window", limit, window); err != nil {
		return nil, err
	}
	return &FixedWindow{limited: limited{"fixed-window", limit}, window: DurationMillis(window)}, nil
}

// current returns the window in force at now and its count.
func (w *FixedWindow) current(st State, now float64) (start, count float64) {
	start = float64(math.Floor(now/w.window) * w.window)
	if len(st) < 2 || start > st[0] {
		return start, 0
	}
	return st[0], st[1]
}

// Delay returns 0 if cost fits in the current window, else the time until the next one starts.
func (w *FixedWindow) Delay(st State, now float64, cost int64) float64 {
	start, count := w.current(st, now)
	if count+float64(cost) <= w.limit {
		return 0
	}
	return (start + w.window) - now
}

// Commit adds cost to the current window.
func (w *FixedWindow) Commit(st State, now, _ float64, cost int64) State {
	start, count := w.current(st, now)
	return set2(st, start, count+float64(cost))
}

// Params returns "f": limit, window.
func (w *FixedWindow) Params() (string, [6]float64) { return "f", [6]float64{w.limit, w.window} }

// Status returns what is left in the current window and the time until it ends.
func (w *FixedWindow) Status(st State, now float64) (remaining, resetAfter float64) {
	start, count := w.current(st, now)
	if count == 0 {
		return w.limit, 0
	}
	return w.limit - count, (start + w.window) - now
}
