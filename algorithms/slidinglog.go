package algorithms

import (
	"math"
	"time"
)

// SlidingLog admits up to Limit units in any window of length Window, exactly:
// it keeps the time and cost of every admitted request still inside the
// window. An entry stamped ts stops counting at ts+Window, so RetryAfter is
// exact. Its state grows with the limit (at most Limit entries), so use it for
// small limits.
//
// Requests admitted at the same instant share one entry. A clock that steps
// back never stamps an entry earlier than the newest one: the entry expires
// later, so it never over-admits.
//
// State layout: [total cost of the entries, ts1, cost1, ts2, cost2, ...] in
// ascending time (ms). The running total makes a call cost O(expired entries)
// rather than O(entries).
type SlidingLog struct {
	limited
	window float64 // ms
}

// NewSlidingLog returns an exact sliding-window log of limit units per window.
func NewSlidingLog(limit float64, window time.Duration) (*SlidingLog, error) {
	if err := validateLimit("sliding-log", limit, window); err != nil {
		return nil, err
	}
	return &SlidingLog{limited: limited{"sliding-log", limit}, window: DurationMillis(window)}, nil
}

// live returns the index of the first entry still in the window at now and
// the total cost of the live entries. Entries are in time order, so only the
// expired ones at the front are visited.
func (l *SlidingLog) live(st State, now float64) (first int, used float64) {
	if len(st) == 0 {
		return 0, 0
	}
	return liveFrom(st, 1, l.window, now)
}

// liveFrom returns the index of the first entry of a log still in its
// window at now and the total cost of the live entries; the entries start
// at index first of st, whose st[0] is their total.
func liveFrom(st State, first int, window, now float64) (int, float64) {
	used := st[0]
	for first+1 < len(st) && st[first]+window <= now {
		used -= st[first+1]
		first += 2
	}
	return first, used
}

// Delay returns 0 if cost fits, else the time until the expiry of the entry
// that frees enough.
func (l *SlidingLog) Delay(st State, now float64, cost int64) float64 {
	first, used := l.live(st, now)
	c := float64(cost)
	if used+c <= l.limit {
		return 0
	}
	for i := first; i+1 < len(st); i += 2 {
		used -= st[i+1]
		if used+c <= l.limit {
			return (st[i] + l.window) - now
		}
	}
	return math.Inf(1) // unreachable for a valid cost: never admitted
}

// Commit drops expired entries and appends (or merges) the new one.
func (l *SlidingLog) Commit(st State, now, _ float64, cost int64) State {
	first, used := l.live(st, now)
	c := float64(cost)
	if len(st) == 0 {
		return append(st, c, now, c)
	}
	n := 1 + copy(st[1:], st[first:])
	st = st[:n]
	st[0] = used + c
	if n >= 3 && st[n-2] >= now { // same instant, or the clock stepped back: merge, never stamp earlier
		st[n-1] += c
		return st
	}
	return append(st, now, c)
}

// GiveBacker is an algorithm whose state can give back units of a
// departure it granted (the sliding logs). Stores call it when a
// reservation settles for less than it reserved, or is cancelled.
type GiveBacker interface {
	GiveBack(st State, now, at float64, units int64) State
}

// GiveBack returns st with units (> 0) taken off the entry stamped at (the
// departure of a request it admitted), never below zero: a request that
// used less than it reserved frees its units when its entry leaves the
// window, as the partner's trailing window frees them. An entry that is
// gone (expired, or merged into a later one) gives nothing back.
func (l *SlidingLog) GiveBack(st State, _, at float64, units int64) State {
	return giveBack(st, 1, at, units)
}

// giveBack takes units off the entry of a log stamped at; its entries
// start at index first of st, whose st[0] is their total.
func giveBack(st State, first int, at float64, units int64) State {
	if units <= 0 {
		return st
	}
	for i := first; i+1 < len(st); i += 2 {
		if st[i] == at {
			g := min(float64(units), st[i+1])
			st[i+1] -= g
			st[0] -= g
			break
		}
	}
	return st
}

// Params returns "l": limit, window.
func (l *SlidingLog) Params() (string, [6]float64) { return "l", [6]float64{l.limit, l.window} }

// Status returns limit minus the live cost and the time until the newest entry expires.
func (l *SlidingLog) Status(st State, now float64) (remaining, resetAfter float64) {
	_, used := l.live(st, now)
	if used == 0 {
		return l.limit, 0
	}
	return l.limit - used, (st[len(st)-2] + l.window) - now
}
