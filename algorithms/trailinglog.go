package algorithms

import (
	"math"
	"time"
)

// TrailingLog is the schedule of a partner that counts a trailing window:
// it grants each request a departure, in order, so that the departures put
// at most Limit units in any window of length Window+Spread, and paces
// them at Limit per Window. Arrivals at the partner that come up to Spread
// after their departures then never put more than Limit units in one of
// the partner's windows of length Window, wherever they start: the log is
// what keeps the partner's count, the pace what keeps the stream steady
// (a full window does not leave at once and then wait a window; it leaves
// at the partner's rate, with a tolerance of a hundredth of the window,
// and up to twice that after a quiet spell). A request that would wait
// more than the longest wait is refused.
//
// A request that used less than it reserved gives its unused units back
// (GiveBack): the log frees them when its entry leaves the window, as the
// partner does, and the pace at once: on a busy key (one that granted a
// departure within the last tenth of the window) the pace keeps up to a
// twentieth of the window of such credit, so that the requests granted after the settle
// leave that much sooner: the stream is paced at the partner's rate in the
// units the calls used, not in their estimates.
//
// State layout: [total cost of the entries, pace (the virtual finish of
// the paced stream, ms), undo (the pace before the newest entry, less what
// was given back since), ts1, cost1, ts2, cost2, ...], entries in
// ascending departure (ms); an entry stamped ts counts until ts+Window+
// Spread.
type TrailingLog struct {
	limited
	window    float64 // ms: the partner's window plus the spread
	maxWait   float64 // ms
	interval  float64 // ms per unit: the partner's window over the limit
	tolerance float64 // ms: how far the pace may run ahead of a departure
	credit    float64 // ms: how far behind a queue's departures the pace may fall by what settles gave back
}

// NewTrailingLog returns the schedule of limit units in any trailing window
// for arrivals up to spread after their departures, waiting at most
// maxQueue (0: never wait).
func NewTrailingLog(limit float64, window, spread, maxQueue time.Duration) (*TrailingLog, error) {
	const name = "trailing-log"
	if err := validateLimit(name, limit, window); err != nil {
		return nil, err
	}
	if spread < 0 || spread > 24*time.Hour {
		return nil, &ConfigError{name, "Spread", spread, "must be between 0 and 24h"}
	}
	if maxQueue < 0 {
		return nil, &ConfigError{name, "MaxQueue", maxQueue, "must be >= 0"}
	}
	w := DurationMillis(window)
	return &TrailingLog{limited: limited{name, limit}, window: w + DurationMillis(spread), maxWait: DurationMillis(maxQueue),
		interval: w / limit, tolerance: w / 100, credit: w / 20}, nil
}

// MaxWait returns the longest wait it grants.
func (l *TrailingLog) MaxWait() float64 { return l.maxWait }

// head is the length of the state's header: total, pace, undo.
const head = 3

// live returns the index of the first entry still in the window at t and
// the total cost of the live entries.
func (l *TrailingLog) live(st State, t float64) (first int, used float64) {
	if len(st) < head {
		return head, 0
	}
	return liveFrom(st, head, l.window, t)
}

// Delay returns how long after now the request departs: no earlier than
// the newest departure granted and the pace allow, and then when its
// window has room for it.
func (l *TrailingLog) Delay(st State, now float64, cost int64) float64 {
	c := float64(cost)
	base := now
	if len(st) >= head {
		if p := st[1] - math.Max(l.tolerance-c*l.interval, 0); p > base {
			base = p
		}
	}
	if len(st) >= head+2 && st[len(st)-2] > base {
		base = st[len(st)-2]
	}
	first, used := l.live(st, base)
	if used+c <= l.limit {
		return base - now
	}
	for i := first; i+1 < len(st); i += 2 {
		used -= st[i+1]
		if used+c <= l.limit {
			return (st[i] + l.window) - now
		}
	}
	return math.Inf(1) // unreachable for a valid cost
}

// Commit records the request's entry at its departure, now+delay, and
// moves the pace on by its cost, from no earlier than the departure less
// the tolerance, or on a busy key less the credit (what was given back
// beyond it is lost). It keeps the pace it found as the undo of a new
// entry, for a cancel.
func (l *TrailingLog) Commit(st State, now, delay float64, cost int64) State {
	at := now + delay
	c := float64(cost)
	if len(st) < head {
		return append(st[:0], c, at+c*l.interval, at, at, c)
	}
	first, used := l.live(st, now)
	credit := l.tolerance // a key quiet for a while: a quiet spell is no credit
	if len(st) >= head+2 && st[len(st)-2] > at-l.interval*l.limit/10 {
		credit = l.credit // a busy key (a departure within a tenth of the window): what settles gave back
	}
	before := st[1]
	pace := math.Max(before, at-credit) + c*l.interval
	n := head + copy(st[head:], st[first:])
	st = st[:n]
	st[0], st[1] = used+c, pace
	if n >= head+2 && st[n-2] >= at { // the same departure: merge (the undo stays the first's)
		st[n-1] += c
		return st
	}
	st[2] = before
	return append(st, at, c)
}

// Status returns the limit minus the units in the window at now, and the
// time until the newest entry has left it and the pace has come back to
// now.
func (l *TrailingLog) Status(st State, now float64) (remaining, resetAfter float64) {
	_, used := l.live(st, now)
	reset := 0.0
	if len(st) >= head {
		reset = math.Max(st[1]-now, 0)
	}
	if len(st) >= head+2 && used > 0 {
		reset = math.Max(reset, (st[len(st)-2]+l.window)-now)
	}
	return l.limit - used, reset
}

// GiveBack takes units off the entry stamped at, never below zero, and
// moves the pace (and the undo) back by what it took; the newest entry,
// left empty (a cancelled reservation), is dropped, and the pace is what
// it was before that entry's commit, less what was given back since. The
// empty entries it leaves newest (reservations cancelled before it) go
// too: a request is held behind the newest departure granted, and an
// empty entry is no departure. The pace then runs no further past the
// newest entry left than its cost's interval or the tolerance, the larger
// (as far as a queue's pace runs past its newest departure): an undo is
// one entry deep, and reservations granted far ahead and cancelled in any
// order must leave no more than the tolerance of pace behind them. No
// entry left, no pace.
func (l *TrailingLog) GiveBack(st State, _, at float64, units int64) State {
	if len(st) < head {
		return st
	}
	before := st[0]
	st = giveBack(st, head, at, units)
	g := (before - st[0]) * l.interval
	if n := len(st); n >= head+2 && st[n-2] == at && st[n-1] == 0 { // the newest entry, all given back (cancelled): gone, so that the next request is not held behind it
		st = st[:n-2]
		for n := len(st); n >= head+2 && st[n-1] == 0; n = len(st) { // their pace was given back with their units
			st = st[:n-2]
		}
		bound := 0.0
		if n := len(st); n >= head+2 {
			bound = st[n-2] + math.Max(st[n-1]*l.interval, l.tolerance)
		}
		st[1] = math.Min(math.Min(st[1]-g, st[2]), bound)
		return st
	}
	st[1] -= g
	st[2] -= g
	return st
}

// Params returns "w": limit, the log's window, longest wait, interval,
// tolerance, credit.
func (l *TrailingLog) Params() (string, [6]float64) {
	return "w", [6]float64{l.limit, l.window, l.maxWait, l.interval, l.tolerance, l.credit}
}
