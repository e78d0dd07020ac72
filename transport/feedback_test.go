package transport

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// feedbackCase is one response, its status and headers, and the
// Feedback it must give at now (headers_test.go: 2026-03-01T12:00:00Z,
// Unix 1772366400).
type feedbackCase struct {
	name   string
	status int
	kv     []string
	want   shaper.Feedback
}

var perHour = func(n int64) shaper.Rate { return shaper.Rate{Count: n, Period: time.Hour} }
var perMinute = func(n int64) shaper.Rate { return shaper.Rate{Count: n, Period: time.Minute} }

// Every dialect's refusal forms, as their documentation gives them, and
// the forms that are not refusals (issue 37, defects 19 and 28).
var feedbackCases = []feedbackCase{
	// GitHub, https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api
	// ("Exceeding the rate limit"): a 403 or a 429; retry-after when
	// present, else x-ratelimit-remaining 0 until x-ratelimit-reset.
	{"github secondary: 403 with retry-after", 403,
		[]string{"retry-after", "60", "x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4990", "x-ratelimit-used", "10",
			"x-ratelimit-reset", "1772368200", "x-ratelimit-resource", "core"},
		shaper.Feedback{Refused: true, Pause: time.Minute, Policy: perHour(5000), Remaining: 4990, Reset: 30 * time.Minute, HasRemaining: true}},
	{"github secondary: 429 with retry-after", 429,
		[]string{"retry-after", "60", "x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4990", "x-ratelimit-reset", "1772368200", "x-ratelimit-resource", "core"},
		shaper.Feedback{Refused: true, Pause: time.Minute, Policy: perHour(5000), Remaining: 4990, Reset: 30 * time.Minute, HasRemaining: true}},
	{"github secondary: 403 with remaining 0", 403,
		[]string{"x-ratelimit-limit", "30", "x-ratelimit-remaining", "0", "x-ratelimit-used", "30", "x-ratelimit-reset", "1772366445", "x-ratelimit-resource", "search"},
		shaper.Feedback{Refused: true, Pause: 45 * time.Second, Policy: perMinute(30)}},
	{"github primary, unauthenticated: 403, remaining 0, the policy kept", 403,
		[]string{"x-ratelimit-limit", "60", "x-ratelimit-remaining", "0", "x-ratelimit-used", "60", "x-ratelimit-reset", "1772369100", "x-ratelimit-resource", "core"},
		shaper.Feedback{Refused: true, Pause: 45 * time.Minute, Policy: perHour(60)}},
	{"github primary: 429, remaining 0", 429,
		[]string{"x-ratelimit-limit", "5000", "x-ratelimit-remaining", "0", "x-ratelimit-reset", "1772366700", "x-ratelimit-resource", "core"},
		shaper.Feedback{Refused: true, Pause: 5 * time.Minute, Policy: perHour(5000)}},
	{"github: a 403 without rate-limit signs is an authorization error", 403,
		[]string{"x-ratelimit-limit", "5000", "x-ratelimit-remaining", "4999", "x-ratelimit-used", "1", "x-ratelimit-reset", "1772368200", "x-ratelimit-resource", "core"},
		shaper.Feedback{Policy: perHour(5000), Remaining: 4999, Reset: 30 * time.Minute, HasRemaining: true}},
	{"a bare 403", 403, nil, shaper.Feedback{}},
	{"a 403 with a malformed retry-after", 403, []string{"retry-after", "soon"}, shaper.Feedback{}},
	{"github: remaining 0 on a 200 pauses without a refusal, the policy kept", 200,
		[]string{"x-ratelimit-limit", "60", "x-ratelimit-remaining", "0", "x-ratelimit-reset", "1772366460", "x-ratelimit-resource", "core"},
		shaper.Feedback{Pause: time.Minute, Policy: perHour(60)}},

	// OpenAI, https://platform.openai.com/docs/guides/rate-limits: a 429,
	// retry-after or retry-after-ms when sent.
	{"openai: 429 with requests exhausted, the policy kept", 429,
		[]string{"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "1s",
			"x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "149000", "x-ratelimit-reset-tokens", "6m0s"},
		shaper.Feedback{Refused: true, Pause: time.Second, Policy: perMinute(60)}},
	{"openai: 429 with retry-after-ms, tokens exhausted", 429,
		[]string{"retry-after-ms", "1500", "x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "59", "x-ratelimit-reset-requests", "1s",
			"x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "20s"},
		shaper.Feedback{Refused: true, Pause: 20 * time.Second, Policy: perMinute(60), Remaining: 59, Reset: time.Second, HasRemaining: true}},
	{"openai: 200, nothing left, the policy kept", 200,
		[]string{"x-ratelimit-limit-requests", "500", "x-ratelimit-remaining-requests", "0", "x-ratelimit-reset-requests", "120ms"},
		shaper.Feedback{Pause: 120 * time.Millisecond, Policy: perMinute(500)}},

	// Anthropic, https://docs.anthropic.com/en/api/rate-limits: a 429 with
	// retry-after.
	{"anthropic: 429 with retry-after, requests exhausted, the policy kept", 429,
		[]string{"retry-after", "17", "anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0",
			"anthropic-ratelimit-requests-reset", "2026-03-01T12:00:17Z"},
		shaper.Feedback{Refused: true, Pause: 17 * time.Second, Policy: perMinute(50)}},
	{"anthropic: 200, nothing left, the policy kept", 200,
		[]string{"anthropic-ratelimit-requests-limit", "50", "anthropic-ratelimit-requests-remaining", "0",
			"anthropic-ratelimit-requests-reset", "2026-03-01T12:00:05Z"},
		shaper.Feedback{Pause: 5 * time.Second, Policy: perMinute(50)}},

	// draft-ietf-httpapi-ratelimit-headers-10: the fields on any status,
	// quota-exceeded is a 429, temporary reduced capacity a 503.
	{"ietf: 429, nothing left, the policy kept", 429,
		[]string{"RateLimit-Policy", `"default";q=100;w=60`, "RateLimit", `"default";r=0;t=30`},
		shaper.Feedback{Refused: true, Pause: 30 * time.Second, Policy: perMinute(100)}},
	{"ietf: 503 with Retry-After pauses, refuses nothing (the partner is unavailable)", 503,
		[]string{"Retry-After", "10", "RateLimit-Policy", `"hourly";q=1000;w=3600`},
		shaper.Feedback{Pause: 10 * time.Second, Policy: perHour(1000)}},
	{"ietf: a 503 without Retry-After is no refusal", 503,
		[]string{"RateLimit-Policy", `"hourly";q=1000;w=3600`},
		shaper.Feedback{Policy: perHour(1000)}},
	{"ietf: 200, nothing left of one policy, the slowest policy kept", 200,
		[]string{"RateLimit-Policy", `"burst";q=10;w=1, "day";q=1000;w=86400`, "RateLimit", `"burst";r=0;t=1, "day";r=500;t=40000`},
		shaper.Feedback{Pause: time.Second, Policy: shaper.Rate{Count: 1000, Period: 24 * time.Hour}, Remaining: 500, Reset: 40000 * time.Second, HasRemaining: true}},
	{"retry-after on a 200 is no pause", 200, []string{"Retry-After", "30"}, shaper.Feedback{}},
}

func TestFeedbackReadsEveryDialectsRefusal(t *testing.T) {
	t.Parallel()
	for _, c := range feedbackCases {
		got := Feedback(&http.Response{StatusCode: c.status, Header: header(c.kv...)}, now)
		if got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
	if got := Feedback(nil, now); got != (shaper.Feedback{}) {
		t.Errorf("a nil response: %+v", got)
	}
}

// GitHub's secondary limit, a 403 with retry-after: 60, holds the key
// for that minute, fleet-wide (a pause), through the transport; a 403
// without rate-limit headers changes nothing (issue 37, defect 19).
func TestAGitHubSecondaryLimitHoldsTheKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		kv    []string
		held  bool
		delay time.Duration
	}{
		{"retry-after", []string{"Retry-After", "60", "X-RateLimit-Remaining", "4990", "X-RateLimit-Resource", "core"}, true, 59 * time.Second},
		{"remaining 0", []string{"X-RateLimit-Limit", "30", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", fmt.Sprint(time.Now().Add(time.Hour).Unix()), "X-RateLimit-Resource", "search"}, true, 14 * time.Minute}, // an hour, cut to WithMaxPause
		{"authorization", []string{"X-RateLimit-Remaining", "4990", "X-RateLimit-Resource", "core"}, false, 0},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			for i := 0; i+1 < len(c.kv); i += 2 {
				w.Header().Set(c.kv[i], c.kv[i+1])
			}
			w.WriteHeader(http.StatusForbidden)
		}))
		s := newShaper(t, shaper.PerSecond(10), shaper.WithName(c.name))
		client := &http.Client{Transport: New(s, WithBase(srv.Client().Transport), WithKey(func(*http.Request) string { return "github" }))}
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		srv.Close()
		r, err := s.Reserve(bg, "github", 1)
		var qf *shaper.QueueFullError
		switch {
		case c.held && !errors.As(err, &qf):
			t.Fatalf("%s: after the 403 the next request is not held: %v, %v", c.name, r.Delay, err)
		case c.held && qf.Delay < c.delay:
			t.Fatalf("%s: after the 403 the next request waits %v, want at least %v", c.name, qf.Delay, c.delay)
		case !c.held && (err != nil || r.Delay > 200*time.Millisecond):
			t.Fatalf("%s: a 403 without rate-limit signs held the key: %v, %v", c.name, r.Delay, err)
		}
	}
}

// A partner's remaining count on a strict contract, through the
// transport and its spacing margin: 10 left in 15 minutes do not hold
// the next request a whole 90 s interval after the last (issue 37,
// defect 30; the shaper's TestAPartnersClampAfterTheMarginSpreadsFromTheNextSlot
// pins the slots on every store, on the fake clock).
func TestAPartnersCountOnAStrictContractDoesNotHoldAWholeInterval(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-RateLimit-Remaining", "10")
		w.Header().Set("X-RateLimit-Reset", "900")
	}))
	defer srv.Close()
	s := newShaper(t, shaper.PerSecond(10))
	client := &http.Client{Transport: New(s, WithBase(srv.Client().Transport), WithKey(func(*http.Request) string { return "partner" }))}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	r, err := s.Reserve(bg, "partner", 1)
	if err != nil {
		t.Fatalf("the next request after the partner's count: %v", err)
	}
	if r.Delay > time.Second {
		t.Fatalf("the next request after the partner's count waits %v", r.Delay)
	}
	if _, err := s.Reserve(bg, "partner", 1); err == nil {
		t.Fatal("the one after it was granted within the default MaxQueue: the partner's 90 s interval was not kept")
	}
}

// FuzzFeedback: the class of defects 19 and 28, over any headers and
// status. A response is a refusal exactly when it is a 429, or a 403 with
// a Retry-After or a limit with nothing left (never a 403 without either,
// never a 503: the partner unavailable, defect 25); a refusal's or a 503's
// Retry-After, and every
// exhausted limit's reset, bound the pause from below, and nothing else
// makes one; the Policy is the slowest request limit ParseLimits states
// that has a rate, whatever is left of it.
func FuzzFeedback(f *testing.F) {
	for _, c := range feedbackCases {
		fields, values := encodeLimitCase(c.kv)
		f.Add(c.status, fields, values)
	}
	for _, c := range limitCases {
		fields, values := encodeLimitCase(c.kv)
		f.Add(403, fields, values)
	}
	f.Fuzz(func(t *testing.T, status int, fields []byte, values string) {
		h := fuzzHeader(fields, values)
		fb := Feedback(&http.Response{StatusCode: status, Header: h}, now)
		limits := ParseLimits(h, now)
		wait, hasWait := RetryAfter(h, now)
		exhausted, longest := false, time.Duration(0)
		for _, l := range limits {
			if l.HasRemaining && l.Remaining < 1 {
				exhausted = true
				if l.HasReset {
					longest = max(longest, l.Reset)
				}
			}
		}
		refusal := status == 429 || status == 403 && (hasWait || exhausted)
		if fb.Refused != refusal {
			t.Fatalf("status %d, %q: Refused %v, want %v", status, values, fb.Refused, refusal)
		}
		want := longest
		if (refusal || status == 503) && hasWait {
			want = max(want, wait)
		}
		if fb.Pause != want {
			t.Fatalf("status %d, %q: Pause %v, want %v", status, values, fb.Pause, want)
		}
		slowest, policy := math.Inf(1), shaper.Rate{}
		for _, l := range limits {
			if r, ok := l.Rate(); ok && l.Dimension == Requests && r < slowest && l.Quota >= 1 && l.Quota < math.MaxInt64/2 {
				slowest, policy = r, shaper.Rate{Count: int64(l.Quota), Period: l.Window}
			}
		}
		if fb.Policy != policy {
			t.Fatalf("status %d, %q: Policy %v, want %v", status, values, fb.Policy, policy)
		}
		if fb.HasRemaining && (fb.Remaining < 1 || fb.Reset <= 0) || !fb.HasRemaining && (fb.Remaining != 0 || fb.Reset != 0) {
			t.Fatalf("status %d, %q: remaining %d in %v (%v)", status, values, fb.Remaining, fb.Reset, fb.HasRemaining)
		}
	})
}
