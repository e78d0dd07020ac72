package shaper

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Rate is a contract: Count units per Period, up to Burst back to back (0
// means 1: strict pacing). 7 per 3 seconds is Rate{Count: 7, Period: 3 *
// time.Second}. Window algorithms and quotas ignore Burst.
type Rate struct {
	Count  int64
	Period time.Duration
	Burst  int64
}

// PerSecond returns n per second.
func PerSecond(n int64) Rate { return Rate{Count: n, Period: time.Second} }

// PerMinute returns n per minute.
func PerMinute(n int64) Rate { return Rate{Count: n, Period: time.Minute} }

// PerHour returns n per hour.
func PerHour(n int64) Rate { return Rate{Count: n, Period: time.Hour} }

// PerDay returns n per 24 hours.
func PerDay(n int64) Rate { return Rate{Count: n, Period: 24 * time.Hour} }

// Every returns one unit per d.
func Every(d time.Duration) Rate { return Rate{Count: 1, Period: d} }

// WithBurst returns r allowing up to b units back to back.
func (r Rate) WithBurst(b int64) Rate {
	r.Burst = b
	return r
}

// burst returns the effective burst: Burst, or 1 when it is zero.
func (r Rate) burst() int64 {
	if r.Burst == 0 {
		return 1
	}
	return r.Burst
}

// Month is 30 days, the "month" of ParseRate; calendar months are Quota(Monthly(offset)).
const Month = 30 * 24 * time.Hour

// units, largest first, as String writes them; ParseRate accepts these and
// the aliases in unitAliases.
var units = []struct {
	name string
	d    time.Duration
}{
	{"month", Month}, {"week", 7 * 24 * time.Hour}, {"day", 24 * time.Hour}, {"h", time.Hour},
	{"min", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}, {"us", time.Microsecond}, {"ns", time.Nanosecond},
}

var unitAliases = map[string]time.Duration{
	"ns": time.Nanosecond, "us": time.Microsecond, "µs": time.Microsecond, "ms": time.Millisecond,
	"s": time.Second, "sec": time.Second, "secs": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "mins": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hrs": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
	"w": 7 * 24 * time.Hour, "wk": 7 * 24 * time.Hour, "week": 7 * 24 * time.Hour, "weeks": 7 * 24 * time.Hour,
	"mo": Month, "month": Month, "months": Month,
}

// String formats r as ParseRate reads it: "10/s", "100/min", "7/3s",
// "5000/h burst 20". The period is written in the largest unit that divides
// it.
func (r Rate) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(r.Count, 10))
	b.WriteByte('/')
	switch {
	case r.Period <= 0:
		b.WriteString(r.Period.String())
	default:
		for _, u := range units {
			if r.Period%u.d == 0 {
				if n := r.Period / u.d; n != 1 {
					b.WriteString(strconv.FormatInt(int64(n), 10))
				}
				b.WriteString(u.name)
				break
			}
		}
	}
	if r.Burst > 1 {
		b.WriteString(" burst ")
		b.WriteString(strconv.FormatInt(r.Burst, 10))
	}
	return b.String()
}

// ParseRate reads a rate written as "COUNT/PERIOD", optionally followed by
// " burst N". PERIOD is a unit, optionally preceded by a number: "10/s",
// "100/min", "10/minute", "5000/h", "1000000/month", "7/3s", "3/1.5s",
// "50/s burst 10". Units: ns, us (µs), ms, s (sec, second), m (min, minute),
// h (hr, hour), d (day), w (wk, week), mo (month; 30 days); plurals are
// accepted and case is ignored. Errors are *RateError and match
// ErrInvalidConfig.
func ParseRate(text string) (Rate, error) {
	fail := func(reason string) (Rate, error) { return Rate{}, &RateError{Input: text, Reason: reason} }
	fields := strings.Fields(strings.ToLower(text))
	var r Rate
	switch len(fields) {
	case 1:
	case 3:
		if fields[1] != "burst" {
			return fail(fmt.Sprintf("unexpected %q after the rate; expected \"burst N\"", fields[1]))
		}
		b, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil || b < 1 {
			return fail(fmt.Sprintf("burst %q is not a whole number >= 1", fields[2]))
		}
		r.Burst = b
	default:
		return fail(`expected "COUNT/PERIOD" with an optional " burst N", such as "10/s" or "5000/h burst 20"`)
	}
	count, period, ok := strings.Cut(fields[0], "/")
	if !ok {
		return fail(`missing "/": expected "COUNT/PERIOD", such as "10/s"`)
	}
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil || n < 1 {
		return fail(fmt.Sprintf("count %q is not a whole number >= 1", count))
	}
	r.Count = n
	i := strings.IndexFunc(period, func(c rune) bool { return (c < '0' || c > '9') && c != '.' })
	if i < 0 {
		return fail(fmt.Sprintf("period %q has no unit; expected one of s, min, h, day, week, month", period))
	}
	unit, ok := unitAliases[period[i:]]
	if !ok {
		return fail(fmt.Sprintf("unknown unit %q; expected one of ns, us, ms, s, min, h, day, week, month", period[i:]))
	}
	mult := 1.0
	if i > 0 {
		if mult, err = strconv.ParseFloat(period[:i], 64); err != nil || !(mult > 0) {
			return fail(fmt.Sprintf("period multiplier %q is not a number > 0", period[:i]))
		}
	}
	d := mult * float64(unit)
	if d >= math.MaxInt64 || d < 1 {
		return fail(fmt.Sprintf("period %q is out of range", period))
	}
	r.Period = time.Duration(math.Round(d))
	return r, nil
}
