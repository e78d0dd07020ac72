package algorithms

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func TestCivilAgreesWithTimePackage1900To2400(t *testing.T) {
	t.Parallel()
	end := time.Date(2401, 1, 1, 0, 0, 0, 0, time.UTC)
	n := 0
	for d := time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC); d.Before(end); d = d.AddDate(0, 0, 1) {
		want := float64(d.Unix() / 86400)
		if got := daysFromCivil(float64(d.Year()), float64(d.Month()), float64(d.Day())); got != want {
			t.Fatalf("daysFromCivil(%s) = %v, want %v", d.Format(time.DateOnly), got, want)
		}
		y, m, dd := civilFromDays(want)
		if y != float64(d.Year()) || m != float64(d.Month()) || dd != float64(d.Day()) {
			t.Fatalf("civilFromDays(%v) = %v-%v-%v, want %s", want, y, m, dd, d.Format(time.DateOnly))
		}
		if got := weekday(want); got != float64(d.Weekday()) {
			t.Fatalf("Weekday(%s) = %v, want %v", d.Format(time.DateOnly), got, d.Weekday())
		}
		n++
	}
	if n != 182987 { // 501 years, 122 of them leap: 126 divisible by 4, less 1900, 2100, 2200, 2300
		t.Fatalf("checked %d days, want 182987", n)
	}
}

// boundsFromTime computes a calendar period with the time package, as the
// reference for Quota.Bounds.
func boundsFromTime(kind cadenceKind, offset time.Duration, first time.Weekday, at time.Time) (time.Time, time.Time) {
	zone := time.FixedZone("q", int(offset/time.Second))
	l := at.In(zone)
	y, m, d := l.Date()
	switch kind {
	case cadenceDay:
		s := time.Date(y, m, d, 0, 0, 0, 0, zone)
		return s, s.AddDate(0, 0, 1)
	case cadenceWeek:
		back := (int(l.Weekday()) - int(first) + 7) % 7
		s := time.Date(y, m, d-back, 0, 0, 0, 0, zone)
		return s, s.AddDate(0, 0, 7)
	default:
		s := time.Date(y, m, 1, 0, 0, 0, 0, zone)
		return s, time.Date(y, m+1, 1, 0, 0, 0, 0, zone)
	}
}

func TestQuotaBoundsAgreeWithTimePackage(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	lo := time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	hi := time.Date(2400, 12, 31, 0, 0, 0, 0, time.UTC).UnixMilli()
	offsets := []time.Duration{0, 14 * time.Hour, -12 * time.Hour, 5*time.Hour + 30*time.Minute, -9*time.Hour - 30*time.Minute, 12*time.Hour + 45*time.Minute}
	for i := range 200000 {
		at := time.UnixMilli(lo + rng.Int64N(hi-lo)).Add(time.Duration(rng.IntN(1e6)))
		off := offsets[i%len(offsets)]
		first := time.Weekday(i % 7)
		for _, c := range []Cadence{Daily(off), Weekly(off, first), Monthly(off)} {
			q := must(NewQuota(10, c))
			s, e := q.Bounds(Millis(at))
			ws, we := boundsFromTime(c.kind, off, first, at)
			if s != Millis(ws) || e != Millis(we) {
				t.Fatalf("kind %d offset %v first %v at %v: bounds [%v, %v), want [%v, %v)",
					c.kind, off, first, at, Time(s), Time(e), ws.UTC(), we.UTC())
			}
		}
	}
}

func utc(y int, m time.Month, d, h, mi, s int) float64 {
	return Millis(time.Date(y, m, d, h, mi, s, 0, time.UTC))
}

func TestQuotaCalendarEdges(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		cadence   Cadence
		at        float64
		wantStart float64
		wantEnd   float64
	}{
		{"leap-year February ends on the 29th", Monthly(0), utc(2028, 2, 29, 23, 59, 59), utc(2028, 2, 1, 0, 0, 0), utc(2028, 3, 1, 0, 0, 0)},
		{"2100 is not a leap year", Monthly(0), utc(2100, 2, 28, 12, 0, 0), utc(2100, 2, 1, 0, 0, 0), utc(2100, 3, 1, 0, 0, 0)},
		{"January ends on the 31st", Monthly(0), utc(2026, 1, 31, 23, 59, 59), utc(2026, 1, 1, 0, 0, 0), utc(2026, 2, 1, 0, 0, 0)},
		{"December rolls into the next year", Monthly(0), utc(2026, 12, 31, 23, 0, 0), utc(2026, 12, 1, 0, 0, 0), utc(2027, 1, 1, 0, 0, 0)},
		{"April has 30 days", Monthly(0), utc(2026, 4, 30, 1, 0, 0), utc(2026, 4, 1, 0, 0, 0), utc(2026, 5, 1, 0, 0, 0)},
		{"week starting Monday: Sunday belongs to the week before", Weekly(0, time.Monday), utc(2026, 3, 1, 23, 0, 0), utc(2026, 2, 23, 0, 0, 0), utc(2026, 3, 2, 0, 0, 0)},
		{"week starting Sunday: Sunday starts a week", Weekly(0, time.Sunday), utc(2026, 3, 1, 0, 0, 0), utc(2026, 3, 1, 0, 0, 0), utc(2026, 3, 8, 0, 0, 0)},
		{"+14h: the local day ends at 10:00 UTC", Daily(14 * time.Hour), utc(2026, 3, 1, 9, 59, 59), utc(2026, 2, 28, 10, 0, 0), utc(2026, 3, 1, 10, 0, 0)},
		{"+14h: a new local day at 10:00 UTC", Daily(14 * time.Hour), utc(2026, 3, 1, 10, 0, 0), utc(2026, 3, 1, 10, 0, 0), utc(2026, 3, 2, 10, 0, 0)},
		{"-12h: still February locally on March 1st UTC morning", Monthly(-12 * time.Hour), utc(2026, 3, 1, 11, 0, 0), utc(2026, 2, 1, 12, 0, 0), utc(2026, 3, 1, 12, 0, 0)},
		{"+14h: already March locally on February 28th UTC", Monthly(14 * time.Hour), utc(2026, 2, 28, 10, 0, 0), utc(2026, 2, 28, 10, 0, 0), utc(2026, 3, 31, 10, 0, 0)},
		{"fixed 7-day periods from an anchor", Fixed(7*24*time.Hour, time.Date(2026, 1, 5, 9, 0, 0, 0, time.UTC)), utc(2026, 1, 4, 0, 0, 0), utc(2025, 12, 29, 9, 0, 0), utc(2026, 1, 5, 9, 0, 0)},
	}
	for _, c := range cases {
		q := must(NewQuota(2, c.cadence))
		s, e := q.Bounds(c.at)
		if s != c.wantStart || e != c.wantEnd {
			t.Errorf("%s: [%v, %v), want [%v, %v)", c.name, Time(s), Time(e), Time(c.wantStart), Time(c.wantEnd))
		}
		// The quota refuses past its limit and retries at the period's end.
		var st State
		var d Decision
		st, _, _ = Reserve(q, st, c.at, 2)
		_, d, _ = Reserve(q, st, c.at, 1)
		if d.Allowed || d.RetryAfter != Duration(c.wantEnd-c.at) {
			t.Errorf("%s: after the limit %+v, want refused until the period ends (%v)", c.name, d, Duration(c.wantEnd-c.at))
		}
		if _, d, _ = Reserve(q, st, c.wantEnd, 2); !d.Allowed {
			t.Errorf("%s: refused at the start of the next period", c.name)
		}
	}
}

func TestQuotaTable(t *testing.T) {
	t.Parallel()
	// 3 per calendar day, UTC. t0 is 12:00.
	q := must(NewQuota(3, Daily(0)))
	run(t, q, []step{
		{"t0", 0, 2, true, 0, 0, 1},
		{"t1 +1h", 1 * hour, 1, true, 0, 0, 0},
		{"t2 +6h refused until midnight", 6 * hour, 1, false, 0, 6 * hour, 0},
		{"t3 midnight", 12 * hour, 3, true, 0, 0, 0},
		{"t-1 clock steps back to yesterday: counted in today", 11 * hour, 1, false, 0, 1*hour + 24*hour, 0},
	})
}

func TestQuotaRollingUsesSlidingBuckets(t *testing.T) {
	t.Parallel()
	q := must(NewQuota(4, Rolling(4*time.Hour, 4)))
	if s, e := q.Bounds(t0); s != t0-4*hour || e != t0 {
		t.Fatalf("rolling bounds [%v, %v), want the trailing 4 h", s-t0, e-t0)
	}
	run(t, q, []step{
		{"t0", 0, 4, true, 0, 0, 0},
		{"t1 +4h the t0 hour-bucket weighs fully at the bucket boundary", 4 * hour, 1, false, 0, 15 * minute, 0},
		{"t2 +4h15m it weighs 3/4", 4*hour + 15*minute, 1, true, 0, 0, 0},
	})
}

func TestQuotaConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []Cadence{
		{}, Daily(14*time.Hour + time.Minute), Monthly(-15 * time.Hour), Weekly(0, 7), Weekly(0, -1),
		Fixed(0, time.Unix(0, 0)), Fixed(time.Microsecond, time.Unix(0, 0)), Rolling(time.Hour, 0),
	} {
		if _, err := NewQuota(10, c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewQuota(10, %+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := NewQuota(0.5, Daily(0)); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("limit 0.5: %v", err)
	}
}
