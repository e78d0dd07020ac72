package partnertest

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// client returns a client of its own, its idle connections closed when the
// test ends.
func client(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 100}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

type response struct {
	status                     int
	retryAfter, policy, remain string
}

func call(t *testing.T, c *http.Client, p *Partner) response {
	t.Helper()
	resp, err := c.Get(p.URL() + "/v1/things")
	if err != nil {
		t.Errorf("GET: %v", err)
		return response{}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return response{resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit")}
}

// burst sends n requests at once and returns how many got 200, and the
// responses.
func burst(t *testing.T, c *http.Client, p *Partner, n int) (int, []response) {
	t.Helper()
	out := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = call(t, c, p) })
	}
	wg.Wait()
	ok := 0
	for _, r := range out {
		if r.status == http.StatusOK {
			ok++
		}
	}
	return ok, out
}

// A burst of requests gets 200 for the tokens the bucket holds and 429
// beyond them, with Retry-After when asked for. (Rate 0.01/s: no token
// accrues while the burst runs.)
func TestBurstBeyondBucket(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		o          Options
		n, ok      int
		retryAfter string
	}{
		{"default burst 1", Options{Rate: 0.01}, 5, 1, ""},
		{"burst 5", Options{Rate: 0.01, Burst: 5}, 12, 5, ""},
		{"rate 0", Options{Burst: 3}, 6, 3, ""},
		{"retry after 1.5s", Options{Rate: 0.01, Burst: 2, RetryAfter: 1500 * time.Millisecond}, 6, 2, "2"},
		{"retry after 1s", Options{Rate: 0.01, RetryAfter: time.Second}, 3, 1, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := New(t, tc.o)
			ok, rs := burst(t, client(t), p, tc.n)
			if ok != tc.ok {
				t.Errorf("%d of %d got 200, want %d", ok, tc.n, tc.ok)
			}
			for _, r := range rs {
				switch {
				case r.status == http.StatusOK && r.retryAfter != "":
					t.Errorf("a 200 carries Retry-After %q", r.retryAfter)
				case r.status == http.StatusTooManyRequests && r.retryAfter != tc.retryAfter:
					t.Errorf("a 429 carries Retry-After %q, want %q", r.retryAfter, tc.retryAfter)
				case r.status != http.StatusOK && r.status != http.StatusTooManyRequests:
					t.Errorf("status %d", r.status)
				case r.policy != "" || r.remain != "":
					t.Errorf("RateLimit fields %q, %q without Options.Policy", r.policy, r.remain)
				}
			}
			log := p.Log()
			got := 0
			for i, a := range log {
				if a.Status == http.StatusOK {
					got++
				}
				if i > 0 && a.At.Before(log[i-1].At) {
					t.Errorf("arrival %d at %v is before arrival %d at %v", i, a.At, i-1, log[i-1].At)
				}
			}
			if len(log) != tc.n || got != ok {
				t.Errorf("the log has %d arrivals, %d of them 200; want %d, %d", len(log), got, tc.n, ok)
			}
		})
	}
}

// SetRate changes the refill at once and keeps the tokens in the bucket.
func TestSetRate(t *testing.T) {
	t.Parallel()
	t.Run("refill follows the new rate", func(t *testing.T) {
		t.Parallel()
		p := New(t, Options{Rate: 0.01, Burst: 10})
		c := client(t)
		if ok, _ := burst(t, c, p, 10); ok != 10 {
			t.Fatalf("%d of a full bucket's 10 got 200", ok)
		}
		p.SetRate(20)
		if p.Rate() != 20 {
			t.Errorf("Rate() = %v after SetRate(20)", p.Rate())
		}
		time.Sleep(250 * time.Millisecond) // 5 tokens at 20/s
		if ok, _ := burst(t, c, p, 10); ok < 5 || ok > 8 {
			t.Errorf("250 ms at 20/s admitted %d of 10, want about 5", ok)
		}
		p.SetRate(0.01)
		time.Sleep(250 * time.Millisecond) // nothing at 0.01/s
		if ok, _ := burst(t, c, p, 10); ok > 1 {
			t.Errorf("250 ms at 0.01/s admitted %d of 10, want 0 or the token SetRate's moment left", ok)
		}
	})
	t.Run("tokens kept", func(t *testing.T) {
		t.Parallel()
		p := New(t, Options{Rate: 0, Burst: 3})
		p.SetRate(0.01)
		if ok, _ := burst(t, client(t), p, 5); ok != 3 {
			t.Errorf("after SetRate the full bucket admitted %d of 5, want its 3", ok)
		}
	})
}

// PauseAll refuses everything for d, with Retry-After the rest of d, and
// empties the bucket; then requests are admitted again.
func TestPauseAll(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		o      Options
		pause  time.Duration
		before string // Retry-After right after PauseAll
		after  int    // of 3 requests after the pause, how many get 200
	}{
		{"refills during the pause", Options{Rate: 100, Burst: 3}, 1500 * time.Millisecond, "2", 3},
		{"a whole second", Options{Rate: 100, Burst: 3, RetryAfter: 5 * time.Second}, time.Second, "1", 3},
		{"emptied", Options{Rate: 0, Burst: 3}, 300 * time.Millisecond, "1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := New(t, tc.o)
			c := client(t)
			start := time.Now()
			p.PauseAll(tc.pause)
			ok, rs := burst(t, c, p, 3)
			if ok != 0 {
				t.Errorf("%d of 3 got 200 during the pause", ok)
			}
			for _, r := range rs {
				if r.retryAfter != tc.before {
					t.Errorf("Retry-After %q during the pause, want %q", r.retryAfter, tc.before)
				}
			}
			time.Sleep(tc.pause/2 - time.Since(start))
			if ok, _ := burst(t, c, p, 3); ok != 0 {
				t.Errorf("%d of 3 got 200 halfway through the pause", ok)
			}
			time.Sleep(tc.pause + 20*time.Millisecond - time.Since(start))
			if ok, rs := burst(t, c, p, 3); ok != tc.after {
				t.Errorf("%d of 3 got 200 after the pause, want %d: %+v", ok, tc.after, rs)
			}
		})
	}
}

var (
	policySyntax = regexp.MustCompile(`^"default";q=(\d+);w=(\d+)$`)
	limitSyntax  = regexp.MustCompile(`^"default";r=(\d+)(;t=(\d+))?$`)
)

// With Policy every response states the limit as draft-10 shows, for
// example `RateLimit-Policy: "default";q=100;w=10` and `RateLimit:
// "default";r=50;t=30`.
func TestPolicyHeaders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		o      Options
		pause  time.Duration
		policy string
		limits []string // of successive requests
	}{
		{"10/s burst 5", Options{Rate: 10, Burst: 5, Policy: true}, 0, `"default";q=10;w=1`,
			[]string{`"default";r=4;t=0`, `"default";r=3;t=0`, `"default";r=2;t=0`, `"default";r=1;t=0`, `"default";r=0;t=1`}},
		{"0.5/s", Options{Rate: 0.5, Policy: true}, 0, `"default";q=1;w=2`,
			[]string{`"default";r=0;t=2`, `"default";r=0;t=2`}},
		{"2.5/s", Options{Rate: 2.5, Burst: 2, Policy: true}, 0, `"default";q=5;w=2`,
			[]string{`"default";r=1;t=0`, `"default";r=0;t=1`}},
		{"rate 0", Options{Burst: 1, Policy: true}, 0, `"default";q=0;w=1`,
			[]string{`"default";r=0`, `"default";r=0`}},
		{"paused", Options{Rate: 100, Burst: 2, Policy: true}, 1500 * time.Millisecond, `"default";q=100;w=1`,
			[]string{`"default";r=0;t=2`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := New(t, tc.o)
			if tc.pause > 0 {
				p.PauseAll(tc.pause)
			}
			c := client(t)
			for i, want := range tc.limits {
				r := call(t, c, p)
				if r.policy != tc.policy {
					t.Errorf("request %d: RateLimit-Policy %q, want %q", i, r.policy, tc.policy)
				}
				if r.remain != want {
					t.Errorf("request %d: RateLimit %q, want %q", i, r.remain, want)
				}
				if !policySyntax.MatchString(r.policy) || !limitSyntax.MatchString(r.remain) {
					t.Errorf("request %d: %q, %q do not have draft-10's shape", i, r.policy, r.remain)
				}
				if i == 0 {
					t.Logf("RateLimit-Policy: %s\nRateLimit: %s (status %d)", r.policy, r.remain, r.status)
				}
			}
		})
	}
}

func TestQuota(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate float64
		q, w int64
	}{
		{25, 25, 1}, {1, 1, 1}, {1000, 1000, 1}, {0.5, 1, 2}, {2.5, 5, 2}, {1.0 / 3, 1, 3},
		{0.2, 1, 5}, {0.1, 1, 10}, {10.0 / 7, 10, 7}, {0.01, 1, 100}, {0, 0, 1},
		{math.Pi, 11310, 3600}, {1e-5, 1, 3600},
	} {
		if q, w := quota(tc.rate); q != tc.q || w != tc.w {
			t.Errorf("quota(%v) = q %d, w %d; want q %d, w %d", tc.rate, q, w, tc.q, tc.w)
		}
	}
}

func TestOptionsRejected(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{{Rate: -1}, {Rate: math.NaN()}, {Rate: math.Inf(1)}, {Rate: 1, Burst: 0.5}, {Rate: 1, Burst: -1}, {Rate: 1, RetryAfter: -time.Second}} {
		if msg := fatalOf(func(tb testing.TB) { New(tb, o) }); !strings.HasPrefix(msg, "partnertest: Options.") {
			t.Errorf("New(%+v) failed with %q, want an Options error", o, msg)
		}
	}
}

// fatalOf runs f with a testing.TB whose Fatalf ends f's goroutine, and
// returns the message.
func fatalOf(f func(testing.TB)) string {
	tb := &fatalTB{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.msg
}

type fatalTB struct {
	testing.TB
	msg string
}

func (*fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
