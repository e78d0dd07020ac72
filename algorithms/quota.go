package algorithms

import (
	"fmt"
	"math"
	"time"
)

// Cadence says how a [Quota]'s periods are laid out in time.
type Cadence struct {
	kind    cadenceKind
	offset  float64 // ms east of UTC
	weekday float64 // first day of the week, 0 = Sunday
	period  float64 // ms, for Fixed and Rolling
	anchor  float64 // ms since the epoch, for Fixed
	buckets int     // for Rolling
	err     error
}

type cadenceKind int

const (
	cadenceDay cadenceKind = iota + 1
	cadenceWeek
	cadenceMonth
	cadenceFixed
	cadenceRolling
)

const dayMillis = 86400000

// MaxOffset bounds a calendar cadence's UTC offset (UTC-14:00 to UTC+14:00 are
// the offsets in civil use).
const MaxOffset = 14 * time.Hour

func calendar(kind cadenceKind, offset time.Duration) Cadence {
	c := Cadence{kind: kind, offset: DurationMillis(offset)}
	if offset < -MaxOffset || offset > MaxOffset {
		c.err = &ConfigError{"quota", "Offset", offset, "must be within ±14h of UTC"}
	}
	return c
}

// Daily is a calendar day starting at midnight at the given UTC offset.
func Daily(offset time.Duration) Cadence { return calendar(cadenceDay, offset) }

// Weekly is a calendar week starting at midnight on first at the given UTC offset.
func Weekly(offset time.Duration, first time.Weekday) Cadence {
	c := calendar(cadenceWeek, offset)
	c.weekday = float64(first)
	if first < time.Sunday || first > time.Saturday {
		c.err = &ConfigError{"quota", "Weekday", first, "must be time.Sunday to time.Saturday"}
	}
	return c
}

// Monthly is a calendar month starting at midnight on the 1st at the given UTC offset.
func Monthly(offset time.Duration) Cadence { return calendar(cadenceMonth, offset) }

// Fixed is a sequence of periods of equal length, one of which starts at anchor.
func Fixed(period time.Duration, anchor time.Time) Cadence {
	c := Cadence{kind: cadenceFixed, period: DurationMillis(period), anchor: Millis(anchor)}
	if period < MinWindow {
		c.err = &ConfigError{"quota", "Period", period, fmt.Sprintf("must be at least %v", MinWindow)}
	}
	return c
}

// Rolling counts over the trailing window, estimated from buckets sub-buckets
// as a [SlidingWindow] does (a 30-day rolling quota with 30 buckets is exact to
// within one day's usage).
func Rolling(window time.Duration, buckets int) Cadence {
	return Cadence{kind: cadenceRolling, period: DurationMillis(window), buckets: buckets}
}

// Quota admits up to Limit units per period of a [Cadence]: a calendar day,
// week or month at a fixed UTC offset (computed with civil-date arithmetic, so
// months have their real lengths and leap years are right), fixed periods from
// an anchor, or a rolling window. A refused request's RetryAfter is the start
// of the next period.
//
// A clock that steps back into an earlier period keeps counting in the period
// it has stored.
//
// State layout: [period start (ms), used, period end (ms)] (Rolling: as
// [SlidingWindow]). Storing the end lets a request inside the stored period
// skip the calendar arithmetic.
type Quota struct {
	limited
	cadence Cadence
	rolling *SlidingWindow
}

// NewQuota returns a quota of limit units per period of c.
func NewQuota(limit float64, c Cadence) (*Quota, error) {
	if c.kind == 0 {
		return nil, &ConfigError{"quota", "Cadence", "zero value", "use Daily, Weekly, Monthly, Fixed or Rolling"}
	}
	if c.err != nil {
		return nil, c.err
	}
	q := &Quota{limited: limited{"quota", limit}, cadence: c}
	if c.kind == cadenceRolling {
		w, err := NewSlidingWindow(limit, roundDuration(c.period), c.buckets)
		if err != nil {
			return nil, err
		}
		q.rolling = w
		return q, nil
	}
	if err := validateCount("quota", limit); err != nil {
		return nil, err
	}
	return q, nil
}

// Bounds returns the start and end (ms) of the period containing t. For a
// rolling cadence that is the trailing window (t-window, t].
func (q *Quota) Bounds(t float64) (start, end float64) {
	c := &q.cadence
	switch c.kind {
	case cadenceFixed:
		start = c.anchor + float64(math.Floor((t-c.anchor)/c.period)*c.period)
		return start, start + c.period
	case cadenceRolling:
		return t - c.period, t
	}
	day := math.Floor((t + c.offset) / dayMillis)
	var first, next float64
	switch c.kind {
	case cadenceDay:
		first, next = day, day+1
	case cadenceWeek:
		first = day - floorMod(day+4-c.weekday, 7)
		next = first + 7
	default: // cadenceMonth
		y, m, _ := civilFromDays(day)
		first = daysFromCivil(y, m, 1)
		if m == 12 {
			next = daysFromCivil(y+1, 1, 1)
		} else {
			next = daysFromCivil(y, m+1, 1)
		}
	}
	return float64(first*dayMillis) - c.offset, float64(next*dayMillis) - c.offset
}

// current returns the period in force at now and its usage. A clock that
// stepped back before the stored period keeps the stored period.
func (q *Quota) current(st State, now float64) (start, used, end float64) {
	if len(st) == 3 && now < st[2] {
		return st[0], st[1], st[2]
	}
	start, end = q.Bounds(now)
	return start, 0, end
}

// Delay returns 0 if cost fits in the current period, else the time until it ends.
func (q *Quota) Delay(st State, now float64, cost int64) float64 {
	if q.rolling != nil {
		return q.rolling.Delay(st, now, cost)
	}
	_, used, end := q.current(st, now)
	if used+float64(cost) <= q.limit {
		return 0
	}
	return end - now
}

// Commit adds cost to the current period.
func (q *Quota) Commit(st State, now, delay float64, cost int64) State {
	if q.rolling != nil {
		return q.rolling.Commit(st, now, delay, cost)
	}
	start, used, end := q.current(st, now)
	if cap(st) < 3 {
		return append(st[:0], start, used+float64(cost), end)
	}
	st = st[:3]
	st[0], st[1], st[2] = start, used+float64(cost), end
	return st
}

// Params returns "q": limit, cadence (1 day, 2 week, 3 month, 4 fixed),
// offset, first weekday, period, anchor; a rolling quota is its sliding window.
func (q *Quota) Params() (string, [6]float64) {
	if q.rolling != nil {
		return q.rolling.Params()
	}
	c := &q.cadence
	return "q", [6]float64{q.limit, float64(c.kind), c.offset, c.weekday, c.period, c.anchor}
}

// Status returns what is left in the current period and the time until it ends.
func (q *Quota) Status(st State, now float64) (remaining, resetAfter float64) {
	if q.rolling != nil {
		return q.rolling.Status(st, now)
	}
	_, used, end := q.current(st, now)
	if used == 0 {
		return q.limit, 0
	}
	return q.limit - used, end - now
}
