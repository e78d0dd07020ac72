package shaper

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want Rate
		str  string
	}{
		{"10/s", PerSecond(10), "10/s"},
		{"100/min", PerMinute(100), "100/min"},
		{"10/minute", PerMinute(10), "10/min"},
		{"5000/h", PerHour(5000), "5000/h"},
		{"1000000/month", Rate{Count: 1000000, Period: Month}, "1000000/month"},
		{"7/3s", Rate{Count: 7, Period: 3 * time.Second}, "7/3s"},
		{"3/1.5s", Rate{Count: 3, Period: 1500 * time.Millisecond}, "3/1500ms"},
		{"50/s burst 10", PerSecond(50).WithBurst(10), "50/s burst 10"},
		{"  20 / s ", Rate{}, ""}, // spaces inside the rate are not accepted
		{"1/day", PerDay(1), "1/day"},
		{"2/week", Rate{Count: 2, Period: 7 * 24 * time.Hour}, "2/week"},
		{"9/90s", Rate{Count: 9, Period: 90 * time.Second}, "9/90s"},
		{"1/250ms", Every(250 * time.Millisecond), "1/250ms"},
		{"12/HOURS Burst 3", PerHour(12).WithBurst(3), "12/h burst 3"},
		{"5/µs", Rate{Count: 5, Period: time.Microsecond}, "5/us"},
	} {
		got, err := ParseRate(c.in)
		if c.str == "" {
			if err == nil {
				t.Errorf("ParseRate(%q) = %v, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseRate(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		if got.String() != c.str {
			t.Errorf("%q.String() = %q, want %q", c.in, got.String(), c.str)
		}
	}
}

func TestParseRateErrorsQuoteTheInput(t *testing.T) {
	t.Parallel()
	for in, reason := range map[string]string{
		"":                         "expected",
		"10":                       `missing "/"`,
		"ten/s":                    `count "ten"`,
		"0/s":                      `count "0"`,
		"-1/s":                     `count "-1"`,
		"10/fortnight":             `unknown unit "fortnight"`,
		"10/3":                     "has no unit",
		"10/0s":                    `multiplier "0"`,
		"10/1.2.3s":                `multiplier "1.2.3"`,
		"10/s burst":               "expected",
		"10/s burst 0":             `burst "0"`,
		"10/s jitter 5":            `unexpected "jitter"`,
		"10/99999999999999999999h": "out of range",
		"10/0.0000001ns":           "out of range",
	} {
		_, err := ParseRate(in)
		var re *RateError
		if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &re) || re.Input != in {
			t.Errorf("ParseRate(%q) = %v, want a *RateError", in, err)
			continue
		}
		if !strings.Contains(err.Error(), reason) || !strings.Contains(err.Error(), `"`+in+`"`) {
			t.Errorf("ParseRate(%q) error %q should quote the input and say %q", in, err, reason)
		}
	}
}

// FuzzParseRate: ParseRate never panics, and whatever it accepts prints with
// String to text that parses back to the same Rate.
func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"10/s", "100/min", "7/3s", "5000/h burst 20", "1000000/month", "3/1.5s", "1/µs", "x/y", "10/s burst", "9/90s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		r, err := ParseRate(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("ParseRate(%q): untyped error %v", in, err)
			}
			return
		}
		if r.Count < 1 || r.Period < 1 || r.Burst < 0 {
			t.Fatalf("ParseRate(%q) accepted %+v", in, r)
		}
		back, err := ParseRate(r.String())
		if err != nil || back != r {
			t.Fatalf("ParseRate(%q) = %+v; String %q parses to %+v, %v", in, r, r.String(), back, err)
		}
	})
}
