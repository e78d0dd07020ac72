package partnertest

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Options describe the partner's limit.
type Options struct {
	// Rate is the bucket's refill rate in tokens (requests) per second;
	// SetRate changes it. 0 admits Burst requests and then none.
	Rate float64
	// Burst is the bucket's capacity in tokens: how many requests the
	// partner admits at once after a quiet spell. It must be 1 or more;
	// 0 means 1.
	Burst float64
	// RetryAfter, when positive, is the Retry-After header of every 429
	// the bucket gives, in whole seconds rounded up (1500 ms is "2"). 429s
	// during a PauseAll always carry Retry-After.
	RetryAfter time.Duration
	// Policy makes every response state the limit in the IETF fields of
	// draft-ietf-httpapi-ratelimit-headers-10: RateLimit-Policy
	// `"default";q=Q;w=W`, where Q/W is the current rate (W is 1 s when
	// the rate is a whole number; otherwise the smallest whole W, up to an
	// hour, that makes Q a whole number; failing that an hour, with Q
	// rounded), and RateLimit `"default";r=R;t=T`, R the whole tokens left
	// after this request (0 during a PauseAll) and T the seconds, rounded
	// up, until a request would next be admitted (0 if one would be now;
	// left out when the rate is 0 and none ever will).
	Policy bool
}

// Arrival is one request the partner got.
type Arrival struct {
	// At is time.Now() when the partner's handler began.
	At time.Time
	// Status is the status it answered: 200 or 429.
	Status int
}

// Partner is an HTTP server on loopback with a token bucket, owned by a
// test. Its methods are safe for concurrent use.
type Partner struct {
	srv        *httptest.Server
	burst      float64
	retryAfter time.Duration
	policy     bool

	mu          sync.Mutex
	rate        float64
	tokens      float64
	last        time.Time // when tokens was last brought up to date
	pausedUntil time.Time
	log         []Arrival
}

// epsilon absorbs float rounding in the bucket: 0.1 s at 10/s is a token.
const epsilon = 1e-9

// New starts a partner with limit o, its bucket full, and closes it when
// the test ends. It fails t if o is invalid.
func New(t testing.TB, o Options) *Partner {
	t.Helper()
	if !(o.Rate >= 0) || math.IsInf(o.Rate, 0) {
		t.Fatalf("partnertest: Options.Rate %v is not a rate: want 0 or more requests per second", o.Rate)
	}
	if o.Burst == 0 {
		o.Burst = 1
	}
	if !(o.Burst >= 1) || math.IsInf(o.Burst, 0) {
		t.Fatalf("partnertest: Options.Burst %v: want 1 or more tokens", o.Burst)
	}
	if o.RetryAfter < 0 {
		t.Fatalf("partnertest: Options.RetryAfter %v is negative", o.RetryAfter)
	}
	p := &Partner{
		burst:      o.Burst,
		retryAfter: o.RetryAfter,
		policy:     o.Policy,
		rate:       o.Rate,
		tokens:     o.Burst,
		last:       time.Now(),
	}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

// URL returns the partner's base URL, http://127.0.0.1:port, with no
// trailing slash. Every path and method under it is limited alike.
func (p *Partner) URL() string { return p.srv.URL }

// Rate returns the current refill rate, per second.
func (p *Partner) Rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// SetRate changes the refill rate to r per second at once. The tokens in
// the bucket stay: those that accrued until now at the old rate count. It
// panics if r is negative or not a number.
func (p *Partner) SetRate(r float64) {
	if !(r >= 0) || math.IsInf(r, 0) {
		panic(fmt.Sprintf("partnertest: SetRate(%v): want 0 or more requests per second", r))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refill(time.Now())
	p.rate = r
}

// PauseAll empties the bucket and refuses every request for d: each gets
// 429 with Retry-After the seconds left of the pause, rounded up. The
// bucket refills during the pause as always, so that when it ends it holds
// what d at the rate brought (up to Burst). A new PauseAll replaces the
// running one; d <= 0 only empties the bucket.
func (p *Partner) PauseAll(d time.Duration) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refill(now)
	p.tokens = 0
	p.pausedUntil = now.Add(max(d, 0))
}

// Log returns every request the partner has got so far, in the order they
// arrived (by At).
func (p *Partner) Log() []Arrival {
	p.mu.Lock()
	out := slices.Clone(p.log)
	p.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Arrival) int { return a.At.Compare(b.At) })
	return out
}

// refill brings the bucket up to date at now; p.mu is held. A now before
// the last update (a request that read the clock before another took the
// lock) counts as the last update.
func (p *Partner) refill(now time.Time) time.Time {
	if now.Before(p.last) {
		return p.last
	}
	p.tokens = min(p.burst, p.tokens+p.rate*now.Sub(p.last).Seconds())
	p.last = now
	return now
}

// untilToken returns how long after now the bucket will next hold a token
// and admit a request, and false if it never will (rate 0); p.mu is held
// and the bucket is up to date at now.
func (p *Partner) untilToken(now time.Time) (time.Duration, bool) {
	wait := max(p.pausedUntil.Sub(now), 0)
	tokens := min(p.burst, p.tokens+p.rate*wait.Seconds())
	if tokens >= 1-epsilon {
		return wait, true
	}
	if p.rate <= 0 {
		return 0, false
	}
	return wait + time.Duration((1-tokens)/p.rate*float64(time.Second)), true
}

func (p *Partner) serve(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	p.mu.Lock()
	now := p.refill(at)
	status, retry := http.StatusOK, time.Duration(0)
	switch {
	case now.Before(p.pausedUntil):
		status, retry = http.StatusTooManyRequests, p.pausedUntil.Sub(now)
	case p.tokens >= 1-epsilon:
		p.tokens = max(p.tokens-1, 0)
	default:
		status, retry = http.StatusTooManyRequests, p.retryAfter
	}
	var policy, limit string
	if p.policy {
		q, w := quota(p.rate)
		policy = fmt.Sprintf(`"default";q=%d;w=%d`, q, w)
		remaining := int64(math.Floor(p.tokens + epsilon))
		if now.Before(p.pausedUntil) {
			remaining = 0 // tokens accrue during a pause, but none may be spent
		}
		limit = fmt.Sprintf(`"default";r=%d`, remaining)
		if d, ok := p.untilToken(now); ok {
			limit += fmt.Sprintf(";t=%d", ceilSeconds(d))
		}
	}
	p.log = append(p.log, Arrival{At: at, Status: status})
	p.mu.Unlock()

	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	if p.policy {
		h.Set("RateLimit-Policy", policy)
		h.Set("RateLimit", limit)
	}
	if status == http.StatusTooManyRequests && retry > 0 {
		h.Set("Retry-After", strconv.FormatInt(ceilSeconds(retry), 10))
	}
	w.WriteHeader(status)
	if status == http.StatusOK {
		_, _ = w.Write([]byte("ok\n"))
	} else {
		_, _ = w.Write([]byte("too many requests\n"))
	}
}

// ceilSeconds returns d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// quota returns the RateLimit-Policy quota q and window w, in seconds, of
// rate: q/w = rate, w = 1 for whole rates, otherwise the smallest w up to
// an hour that makes q whole (w = 2, q = 1 for 0.5/s; w = 2, q = 5 for
// 2.5/s), and failing that w = 3600 with q rounded. Rate 0 is q = 0, w = 1.
func quota(rate float64) (q, w int64) {
	if rate <= 0 {
		return 0, 1
	}
	for w := int64(1); w <= 3600; w++ {
		x := rate * float64(w)
		if r := math.Round(x); r >= 1 && math.Abs(x-r) <= epsilon*max(1, x) {
			return int64(r), w
		}
	}
	return max(int64(math.Round(rate*3600)), 1), 3600
}
