package transport

import (
	"fmt"
	"math"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The grammars of the numbers ParseLimits reads (its doc): a plain count,
// plain seconds or milliseconds, and RFC 9651's sf-integer and sf-decimal.
var (
	countGrammar   = regexp.MustCompile(`^[ \t]*[0-9]+[ \t]*$`)
	decimalGrammar = regexp.MustCompile(`^[ \t]*[0-9]+(\.[0-9]+)?[ \t]*$`)
	sfGrammar      = regexp.MustCompile(`^-?([0-9]{1,15}|[0-9]{1,12}\.[0-9]{1,3})$`)
	sfRun          = regexp.MustCompile(`^-?[0-9]+(\.[0-9]*)?`) // what RFC 9651's number parser consumes
)

// malformedNumbers are values no dialect's grammar takes for a number
// (issue 37, defect 29: strconv.ParseFloat took most of them).
var malformedNumbers = []string{
	"0x1p4", "0x10", "0X1P-2", "1_000", "Inf", "+Inf", "-Inf", "infinity", "NaN", "nan",
	"+5", "-5", "1e3", "1E3", "5e-1", ".5", "5.", `"5"`, "5 5", "1,000", "0b101", "0o17",
	"5\u00a0", "\u00a05", "\u20065", "５", "٥", "5\x00", "", " ", "--5",
}

// countFields hold plain counts: digits only.
var countFields = []string{
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "RateLimit-Remaining",
	"x-ratelimit-limit-requests", "x-ratelimit-remaining-tokens",
	"anthropic-ratelimit-requests-limit", "anthropic-ratelimit-output-tokens-remaining",
}

// secondFields hold seconds, digits with an optional fraction.
var secondFields = []string{"X-RateLimit-Reset", "RateLimit-Reset", "x-ratelimit-reset-requests"}

func TestMalformedNumbersAreIgnored(t *testing.T) {
	t.Parallel()
	for _, f := range append(append([]string{}, countFields...), secondFields...) {
		if ParseLimits(header(f, "5"), now) == nil {
			t.Fatalf("%s: 5 is not read", f)
		}
		for _, v := range malformedNumbers {
			if got := ParseLimits(header(f, v), now); got != nil {
				t.Errorf("%s: %q is read:%s", f, v, fmtLimits(got))
			}
		}
	}
	for _, f := range countFields {
		if got := ParseLimits(header(f, "2.5"), now); got != nil {
			t.Errorf("%s: a count with a fraction is read:%s", f, fmtLimits(got))
		}
	}
	for _, f := range secondFields {
		if ParseLimits(header(f, "2.5"), now) == nil {
			t.Errorf("%s: seconds with a fraction are not read", f)
		}
	}
	quota := []Limit{{Dimension: Requests, Quota: 10, Dialect: "x-ratelimit"}}
	for _, v := range malformedNumbers {
		if got := ParseLimits(header("X-RateLimit-Limit", "10", "X-RateLimit-Used", v), now); !reflect.DeepEqual(got, quota) {
			t.Errorf("X-RateLimit-Used %q is read:%s", v, fmtLimits(got))
		}
		if d, ok := RetryAfter(header("Retry-After-Ms", v), now); ok {
			t.Errorf("retry-after-ms %q is read: %v", v, d)
		}
		if d, ok := RetryAfter(header("Retry-After", v), now); ok {
			t.Errorf("Retry-After %q is read: %v", v, d)
		}
		if v == "1,000" {
			continue // in a Structured Field List, two members: 1 and 000
		}
		for _, sf := range []string{`"p";q=%s;w=1`, `"p";q=1;w=%s`, `%s;w=1`} {
			if got := ParseLimits(header("RateLimit-Policy", fmt.Sprintf(sf, v)), now); got != nil {
				t.Errorf("RateLimit-Policy %q is read:%s", fmt.Sprintf(sf, v), fmtLimits(got))
			}
		}
		if got := ParseLimits(header("RateLimit", `"p";r=`+v), now); got != nil {
			t.Errorf("RateLimit r=%q is read:%s", v, fmtLimits(got))
		}
		if got := ParseLimits(header("RateLimit", "limit="+v), now); got != nil {
			t.Errorf("RateLimit limit=%q is read:%s", v, fmtLimits(got))
		}
	}
}

// Anthropic's resets are RFC 3339 date-times (section 5.6), which
// time.Parse reads with leniencies.
func TestRFC3339(t *testing.T) {
	t.Parallel()
	at := func(s string, off int) time.Time {
		tm, err := time.Parse("2006-01-02T15:04:05.999999999", s)
		if err != nil {
			t.Fatal(err)
		}
		return tm.Add(-time.Duration(off) * time.Second)
	}
	for _, c := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"2026-03-01T12:00:01Z", at("2026-03-01T12:00:01", 0), true},
		{"2026-03-01t12:00:01z", at("2026-03-01T12:00:01", 0), true},
		{"2026-03-01T12:00:01.5Z", at("2026-03-01T12:00:01.5", 0), true},
		{"2026-03-01T12:00:01.1234567891Z", at("2026-03-01T12:00:01.123456789", 0), true},
		{"2026-03-01T13:30:01+01:30", at("2026-03-01T13:30:01", 5400), true},
		{"2026-03-01T10:00:01-02:00", at("2026-03-01T10:00:01", -7200), true},
		{"2024-02-29T00:00:00Z", at("2024-02-29T00:00:00", 0), true},
		{"2026-03-01T12:00:01,5Z", time.Time{}, false},
		{"2026-03-01T12:00:01+24:00", time.Time{}, false},
		{"2026-03-01T12:00:01+23:60", time.Time{}, false},
		{"2026-03-01T12:00:01+0100", time.Time{}, false},
		{"2026-03-01T12:00:60Z", time.Time{}, false},
		{"2026-02-29T00:00:00Z", time.Time{}, false},
		{"2026-13-01T00:00:00Z", time.Time{}, false},
		{"2026-03-01T24:00:00Z", time.Time{}, false},
		{"2026-03-01 12:00:01Z", time.Time{}, false},
		{"2026-03-01T12:00:01.Z", time.Time{}, false},
		{"2026-03-01T12:00:01", time.Time{}, false},
		{"+2026-03-01T12:00:01Z", time.Time{}, false},
		{"1772366460", time.Time{}, false},
	} {
		got, ok := parseRFC3339(c.in)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("parseRFC3339(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// FuzzNumberGrammar: each number parser takes exactly its grammar's
// numbers, and reads them as strconv.ParseFloat reads the digits
// (saturating past float64).
func FuzzNumberGrammar(f *testing.F) {
	for _, v := range append(malformedNumbers, "5", "0", "007", " 12\t", "2.5", "1.", "999999999999999", "9999999999999999",
		"123456789012.123", "1234567890123.1", "1.1234", "-0", "-12.5", "1"+strings.Repeat("0", 400), "12;q=1", "1.2.3") {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		want := func(s string) float64 {
			x, _ := strconv.ParseFloat(s, 64)
			return min(x, math.MaxFloat64)
		}
		trimmed := strings.Trim(v, " \t")
		if n, ok := plainCount(v); ok != countGrammar.MatchString(v) || ok && n != want(trimmed) || !ok && n != 0 {
			t.Fatalf("plainCount(%q) = %v, %v", v, n, ok)
		}
		if n, ok := plainDecimal(v); ok != decimalGrammar.MatchString(v) || ok && n != want(trimmed) || !ok && n != 0 {
			t.Fatalf("plainDecimal(%q) = %v, %v", v, n, ok)
		}
		p := &sfParser{s: v}
		it, ok := p.number()
		run := sfRun.FindString(v)
		if ok != sfGrammar.MatchString(run) {
			t.Fatalf("sf number %q: ok %v, its run %q", v, ok, run)
		}
		if ok && (p.i != len(run) || it.num != want(run) || it.integer == strings.Contains(run, ".")) {
			t.Fatalf("sf number %q: %+v after %d bytes, its run %q", v, it, p.i, run)
		}
	})
}

// FuzzRFC3339: what parseRFC3339 reads, time.Parse reads the same (with
// "T" and "Z" in upper case); what it refuses and time.Parse reads is one
// of time.Parse's leniencies (a comma for the point, a one-digit hour, an
// offset past 23:59: not RFC 3339's shape).
func FuzzRFC3339(f *testing.F) {
	for _, s := range []string{"2026-03-01T12:00:01Z", "2026-03-01t12:00:01.5z", "2026-03-01T12:00:01,5Z", "2026-03-01T12:00:01+24:00",
		"2026-03-01T12:00:01-23:59", "2024-02-29T23:59:59.999999999999Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59+00:00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseRFC3339(s)
		norm := []byte(s)
		if len(norm) > 10 && norm[10] == 't' {
			norm[10] = 'T'
		}
		if n := len(norm); n > 0 && norm[n-1] == 'z' {
			norm[n-1] = 'Z'
		}
		want, err := time.Parse(time.RFC3339, string(norm))
		switch {
		case ok && (err != nil || !got.Equal(want)):
			t.Fatalf("parseRFC3339(%q) = %v; time.Parse: %v, %v", s, got, want, err)
		case !ok && err == nil && rfc3339Shape.MatchString(s) && !offsetPast(s):
			t.Fatalf("parseRFC3339(%q) refuses what time.Parse reads as %v", s, want)
		}
	})
}

// rfc3339Shape is RFC 3339's date-time, its ranges aside.
var rfc3339Shape = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$`)

// offsetPast reports whether s ends in an offset ±hh:mm past 23:59.
func offsetPast(s string) bool {
	if len(s) < 6 {
		return false
	}
	o := s[len(s)-6:]
	return (o[0] == '+' || o[0] == '-') && o[3] == ':' && (o[1:3] > "23" || o[4:6] > "59")
}

// Issue 37, defect 26: what ParseLimits reads is bounded. A field line
// longer than 4,096 bytes is ignored, as malformed (a 1 MB
// RateLimit-Policy took 3 to 3.8 s to parse in every RoundTrip on
// 0d46bc9), the lines after a field's 16th are ignored, and the other
// fields still count.
func TestParseLimitsBoundsWhatItReads(t *testing.T) {
	t.Parallel()
	var big strings.Builder
	for i := 0; big.Len() < 1<<20; i++ {
		fmt.Fprintf(&big, `"p%d";q=%d;w=60, `, i, i+1)
	}
	h := header("RateLimit-Policy", strings.TrimSuffix(big.String(), ", "), "RateLimit-Policy", `"ok";q=5;w=1`)
	if got, want := ParseLimits(h, now), []Limit{{Dimension: Requests, Policy: "ok", Quota: 5, Window: time.Second, Dialect: "ietf"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("a 1 MB line beside a short one: %d limits, want the short line's", len(got))
	}
	h = http.Header{}
	for i := range 20 {
		h.Add("RateLimit-Policy", fmt.Sprintf(`"p%d";q=%d;w=1`, i, i+1))
	}
	if got := ParseLimits(h, now); len(got) != maxFieldLines || got[len(got)-1].Policy != "p15" {
		t.Fatalf("20 lines of a field: %d limits read, the last %+v; want the first 16", len(got), got[len(got)-1])
	}
	line := func(n int) string { // a line of n bytes: a policy padded with a comment parameter
		s := `"a";q=1;w=1;c="`
		return s + strings.Repeat("x", n-len(s)-1) + `"`
	}
	if got := ParseLimits(header("RateLimit-Policy", line(maxFieldBytes)), now); len(got) != 1 {
		t.Fatalf("a line of %d bytes: %d limits", maxFieldBytes, len(got))
	}
	if got := ParseLimits(header("RateLimit-Policy", line(maxFieldBytes+1)), now); got != nil {
		t.Fatalf("a line of %d bytes is read:%s", maxFieldBytes+1, fmtLimits(got))
	}
	if got := ParseLimits(header("X-RateLimit-Limit", strings.Repeat("9", maxFieldBytes+1), "X-RateLimit-Remaining", "3"), now); len(got) != 1 || got[0].Quota != 0 || got[0].Remaining != 3 {
		t.Fatalf("an X-RateLimit-Limit of %d digits:%s", maxFieldBytes+1, fmtLimits(got))
	}
}

// pairingLines are a RateLimit-Policy of n policies (every other one
// with a partition key) and a RateLimit naming each in the other order,
// each one line parsed whole, past the bounds ParseLimits keeps.
func pairingLines(n int) (policy, ratelimit []sfLine) {
	var pl, rl []string
	for i := range n {
		pk := ""
		if i%2 == 1 {
			pk = ";pk=:YQ==:"
		}
		pl = append(pl, fmt.Sprintf(`"p%d";q=%d;w=60%s`, i, i+1, pk))
		rl = append(rl, fmt.Sprintf(`"p%d";r=%d;t=30%s`, n-1-i, i, pk))
	}
	parse := func(members []string) []sfLine {
		line := strings.Join(members, ", ")
		items, ok := parseSFList(line, n)
		return []sfLine{{text: line, items: items, list: ok}}
	}
	return parse(pl), parse(rl)
}

// worstHeader fills every Structured Field ParseLimits reads to its
// bounds, maxFieldLines lines of maxFieldBytes, with distinct members, and
// adds as much again past the bounds.
func worstHeader() http.Header {
	h := http.Header{}
	n := 0
	for _, f := range []struct{ field, format string }{
		{"RateLimit-Policy", `"p%d";q=1`}, {"RateLimit", `"p%d";r=1`}, {"RateLimit-Limit", `%d;w=1`},
	} {
		for range 2 * maxFieldLines {
			var line strings.Builder
			for {
				m := fmt.Sprintf(f.format, n)
				if line.Len()+len(m)+1 > maxFieldBytes {
					break
				}
				if line.Len() > 0 {
					line.WriteString(",")
				}
				line.WriteString(m)
				n++
			}
			h.Add(f.field, line.String())
		}
	}
	return h
}

// BenchmarkParseLimits: the most a response can make ParseLimits read
// (worst: every Structured Field it reads filled to its bounds, and as
// much again past them) costs a bounded time (go test -run - -bench
// ParseLimits ./transport); on 0d46bc9 a 1 MB RateLimit-Policy took
// seconds.
func BenchmarkParseLimits(b *testing.B) {
	h := worstHeader()
	for b.Loop() {
		ParseLimits(h, now)
	}
}

// BenchmarkIETFPairing: pairing n policies with their service limits
// takes a time per policy that stays flat as n grows (index, as
// ParseLimits does it), where scanning the list for every member (scan,
// 0d46bc9's way) grows with n (go test -run - -bench IETFPairing
// ./transport). The bounds on what ParseLimits reads keep n at most 64
// either way; this measures the pairing past them.
func BenchmarkIETFPairing(b *testing.B) {
	for _, n := range []int{64, 512, 4096} {
		pl, rl := pairingLines(n)
		if got, want := appendIETFLimits(nil, pl, rl), scanIETFLines(pl, rl); len(got) != n || !reflect.DeepEqual(got, want) {
			b.Fatalf("%d policies paired of %d, or not as the scan pairs them", len(got), n)
		}
		for _, way := range []struct {
			name string
			pair func() []Limit
		}{
			{"index", func() []Limit { return appendIETFLimits(nil, pl, rl) }},
			{"scan", func() []Limit { return scanIETFLines(pl, rl) }},
		} {
			b.Run(fmt.Sprintf("policies=%d/%s", n, way.name), func(b *testing.B) {
				for b.Loop() {
					way.pair()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/policy")
			})
		}
	}
}
