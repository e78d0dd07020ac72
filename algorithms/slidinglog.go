package algorithms

import "time"

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
// State layout: [ts1, cost1, ts2, cost2, ...] in ascending time (ms).
type SlidingLog struct {
	limit  float64
	window float64
}

// NewSlidingLog returns an exact sliding-window log of limit units per window.
func NewSlidingLog(limit float64, window time.Duration) (*SlidingLog, error) {
	if err := validateLimit("sliding-log", limit, window); err != nil {
		return nil, err
	}
	return &SlidingLog{limit: limit, window: DurationMillis(window)}, nil
}

// Name returns "sliding-log".
func (*SlidingLog) Name() string { return "sliding-log" }

// MaxWait returns 0.
func (*SlidingLog) MaxWait() float64 { return 0 }

// ValidateCost refuses costs below 1 and above the limit.
func (l *SlidingLog) ValidateCost(cost int64) error {
	return checkCost("sliding-log", cost, l.limit, "the limit")
}

// live returns the index of the first entry still in the window at now and
// the total cost of the live entries.
func (l *SlidingLog) live(st State, now float64) (first int, used float64) {
	first = len(st)
	for i := 0; i+1 < len(st); i += 2 {
		if st[i]+l.window > now {
			if first == len(st) {
				first = i
			}
			used += st[i+1]
		}
	}
	return first, used
}

// Earliest returns now if cost fits, else the expiry of the entry that frees enough.
func (l *SlidingLog) Earliest(st State, now float64, cost int64) float64 {
	first, used := l.live(st, now)
	c := float64(cost)
	if used+c <= l.limit {
		return now
	}
	for i := first; i+1 < len(st); i += 2 {
		used -= st[i+1]
		if used+c <= l.limit {
			return st[i] + l.window
		}
	}
	return now // unreachable for a valid cost
}

// Commit drops expired entries and appends (or merges) the new one.
func (l *SlidingLog) Commit(st State, now, at float64, cost int64) State {
	first, _ := l.live(st, now)
	n := copy(st, st[first:])
	st = st[:n]
	stamp := now
	if n >= 2 && st[n-2] >= stamp {
		stamp = st[n-2]
		st[n-1] += float64(cost)
		return st
	}
	return append(st, stamp, float64(cost))
}

// Status returns limit minus the live cost and the time until the newest entry expires.
func (l *SlidingLog) Status(st State, now float64) (remaining, resetAfter float64) {
	_, used := l.live(st, now)
	if used == 0 {
		return l.limit, 0
	}
	return l.limit - used, (st[len(st)-2] + l.window) - now
}
