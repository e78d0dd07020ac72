package transport

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// DefaultSpacingMargin is the margin a Transport keeps between a strict
// contract's departures on a key once the partner has refused one of its
// requests, unless WithSpacingMargin says otherwise (see
// shaper.Shaper.Space; at most a tenth of the interval): 4 ms, which
// covers what a departure's timer wake-up, a new connection's dial and
// the HTTP client add on a loaded machine, in one process and across a
// fleet, measured against nginx's limit_req with no burst (docs/TRANSPORT.md).
// A partner declared with package partner needs none: its schedule allows
// for the lateness already, and it is never refused.
const DefaultSpacingMargin = 4 * time.Millisecond

// DefaultMaxPause caps the pause a partner's Retry-After or rate-limit
// headers can impose on a key, unless WithMaxPause says otherwise.
const DefaultMaxPause = 15 * time.Minute

// Transport is a pacing http.RoundTripper; see New.
type Transport struct {
	r        shaper.Reserver
	base     http.RoundTripper
	key      func(*http.Request) string
	flow     func(*http.Request) (shaper.Flow, bool) // WithFlow
	cost     func(*http.Request) int64
	maxWait  time.Duration
	feedback bool
	maxPause time.Duration
	margin   time.Duration
	always   bool          // WithSpacingMargin: the margin from the first request, not from the first refusal
	usage    usageFunc     // WithUsage, WithUsageCosts
	abandon  time.Duration // WithAbandonGrace (inflight.go)
	spaced   sync.Map      // key -> unix ns: when its margin is due for renewal
	nspaced  atomic.Int64  // entries added to spaced since its last sweep
}

var _ http.RoundTripper = (*Transport)(nil)

// Option configures New.
type Option func(*Transport)

// WithBase sets the transport that sends the requests (nil, the default,
// means http.DefaultTransport).
func WithBase(rt http.RoundTripper) Option { return func(t *Transport) { t.base = rt } }

// WithKey sets how a request is keyed (default: its host, port included).
func WithKey(f func(*http.Request) string) Option {
	return func(t *Transport) {
		if f != nil {
			t.key = f
		}
	}
}

// WithCost sets what a request costs (default 1).
func WithCost(f func(*http.Request) int64) Option {
	return func(t *Transport) {
		if f != nil {
			t.cost = f
		}
	}
}

// WithFlow names each request's flow (a tenant, a user; see shaper.Flow),
// when f reports one, so that the requests waiting on a key take their
// flows' turns instead of arrival order (docs/FAIRNESS.md). Without it,
// a flow the request's ctx carries (shaper.WithFlow) is used.
func WithFlow(f func(*http.Request) (shaper.Flow, bool)) Option {
	return func(t *Transport) { t.flow = f }
}

// WithMaxWait bounds how long a request may wait for its slot (0, the default,
// leaves it to the shaper's MaxQueue). Longer waits fail at once with a
// *shaper.QueueFullError and send nothing. It bounds the wait for an
// in-flight permit too (see New): a request still without one when it has
// passed fails then with a *shaper.QueueFullError whose InFlight is set.
func WithMaxWait(d time.Duration) Option { return func(t *Transport) { t.maxWait = max(d, 0) } }

// WithFeedback turns the partner's feedback on or off (default on): a
// refusal with Retry-After (see Feedback: a 429, a 503, GitHub's 403), or
// rate-limit headers with nothing remaining, pause
// the request's key (see Shaper.Pause); headers with fewer calls remaining
// before their reset than the contract would send clamp it, so that the
// fleet spreads them evenly until the reset (see Shaper.Clamp). Feedback
// only ever slows a key down.
func WithFeedback(on bool) Option { return func(t *Transport) { t.feedback = on } }

// WithMaxPause caps the pause feedback can impose (default DefaultMaxPause;
// at most shaper.MaxPause, which a larger value is taken to mean). A partner
// asking for more gets the cap, never nothing. It does not cut a remaining
// count's reset: the count is spread until its reset however far (up to
// shaper.MaxPause), never faster than it allows.
func WithMaxPause(d time.Duration) Option {
	return func(t *Transport) { t.maxPause = min(max(d, 0), shaper.MaxPause) }
}

// WithUsage settles each call's reservation with what the partner says it
// used, read by usage from the response and its body once the caller has
// read the body to its end or closed it (OpenAI and Anthropic report the
// tokens a completion used in its JSON body, a stream in its last event).
// usage gets the last MaxUsageBody bytes of the body; it returns false
// when the body says nothing of it, and the reservation keeps its
// estimate (Settle may still settle it). A refused call that says when to
// come back (a 429 or 503 with Retry-After) is settled at nothing whatever
// the option, as the partner counted nothing for it. A request whose
// context carries shaper.WithCosts settles the dimensions it names at
// their reserved costs: use WithUsageCosts to settle them at their own.
func WithUsage(usage func(resp *http.Response, body []byte) (used int64, ok bool)) Option {
	return func(t *Transport) {
		t.usage = func(resp *http.Response, body []byte) (int64, shaper.Costs, bool) {
			used, ok := usage(resp, body)
			return used, nil, ok
		}
	}
}

// WithUsageCosts is WithUsage for a partner that counts parts of a call
// apart (Anthropic's input and output tokens, each per minute, reserved
// with shaper.WithCosts on the request's context): usage returns the cost
// of each dimension it names, as shaper.Costs, and used for the others.
// The last of WithUsage and WithUsageCosts applies.
func WithUsageCosts(usage func(resp *http.Response, body []byte) (used int64, costs shaper.Costs, ok bool)) Option {
	return func(t *Transport) { t.usage = usage }
}

// WithSpacingMargin sets the margin kept between the departures of a
// strict contract (burst 1) on every key the Transport sends on, from its
// first request (0: none). By default the margin is DefaultSpacingMargin,
// kept on a key only once the partner has refused a request of it (a
// partner that counts requests per window, or a bucket with a burst, is
// not refused for spacing, and the margin would only cost it its rate;
// nor is a partner declared with package partner). It is kept so that a
// partner measuring the spacing
// of its arrivals strictly never sees two requests closer than the
// contract's interval, however late each leaves (see
// shaper.Shaper.Space: at most a tenth of the interval, fleet-wide,
// renewed while the key is used). It costs the key that much of its rate:
// 4 ms on 100 ms at 10/s is 4 %, a tenth at 25/s and faster. Each
// Transport also holds a request whose predecessor on the key reached
// the wire late (a new connection's dial) until its own slot plus that
// lateness less the margin, so that the two do not arrive too close.
func WithSpacingMargin(d time.Duration) Option {
	return func(t *Transport) { t.margin, t.always = max(d, 0), true }
}

// New returns an http.RoundTripper that waits for a departure slot on r before
// sending each request through the base transport.
//
// It never modifies the caller's request and closes the request body on
// every error path, as the RoundTripper contract requires. A request whose
// slot would fall after its context's deadline is not sent: the slot is given
// back and RoundTrip fails at once with a *shaper.DeadlineError (it matches
// context.DeadlineExceeded). A request whose context ends while it waits gives
// its slot back and fails with the context's error.
//
// When r holds in-flight permits for the request's key (a shaper with a
// Dimension.InFlight, see shaper.PermitHolder), the request first waits
// for a permit (shaper.Shaper.Acquire), then for its slot, and holds the
// permit for as long as the call is open: until the response body is
// closed, or read to its end (a Read returning io.EOF, or failing), whichever
// comes first; a response without a body (http.NoBody) gives it back at
// once, and so does a round trip that fails (the base transport's error, a
// request body that cannot be sent). A caller must
// therefore close every response body, as net/http asks anyway; a body
// left open keeps its permit. The body of a 101 Switching Protocols
// response, the upgraded connection, stays an io.ReadWriteCloser (with
// CloseWrite) and holds the permit until it is closed or reaches EOF. With
// NewRetryableClient each attempt holds its own permit, given back when
// go-retryablehttp drains and closes the attempt's body before retrying. A
// Reserver that holds permits but has no Acquire method is reserved on
// instead (Reserve), which takes a permit only if one is free: with none
// free the request fails at once with a *shaper.QueueFullError whose
// InFlight is set.
func New(r shaper.Reserver, opts ...Option) *Transport {
	t := &Transport{
		r:        r,
		key:      func(req *http.Request) string { return req.URL.Host },
		cost:     func(*http.Request) int64 { return 1 },
		feedback: true,
		maxPause: DefaultMaxPause,
		margin:   DefaultSpacingMargin,
		abandon:  DefaultAbandonGrace,
	}
	for _, o := range opts {
		o(t)
	}
	return t
}

func (t *Transport) baseRT() http.RoundTripper {
	if t.base == nil {
		return http.DefaultTransport
	}
	return t.base
}

// RoundTrip waits for the request's slot (and in-flight permit, see New),
// sends it, and feeds the response's rate-limit signals back to the shaper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.r == nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, &shaper.ConfigError{Algorithm: "transport", Field: "Reserver", Value: nil, Reason: "transport.New was given a nil Reserver"}
	}
	key, cost := t.key(req), t.cost(req)
	ctx := req.Context()
	if t.flow != nil {
		if f, ok := t.flow(req); ok {
			ctx = shaper.WithFlow(ctx, f)
		}
	}
	holds := t.holdsPermits(key)
	t.space(ctx, key)
	res, err := t.wait(ctx, key, cost, holds)
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	// The reservation may hold an in-flight permit: the response body
	// releases it when it is done (handed), every other way out of here
	// releases it now. Release does nothing without a permit.
	handed := false
	var tk *ticket // the reservation the request carries, for Settle
	if res != nil {
		defer func() {
			if !handed {
				_ = res.Release(context.WithoutCancel(ctx))
			}
		}()
		// The request carries its reservation, for Settle. The zero
		// Reservation is no shaper's grant: Route or otelshaper.Wrap over a
		// Reserver without Acquire waited and had none to return. Settle
		// reports it rather than settle nothing.
		tk = &ticket{r: *res, none: *res == shaper.Reservation{}}
		req = req.WithContext(context.WithValue(ctx, ticketKey{}, tk))
		if *res != (shaper.Reservation{}) {
			if req, err = t.keepSpacing(req, key, res); err != nil {
				if req.Body != nil {
					_ = req.Body.Close()
				}
				return nil, err
			}
		}
	}
	resp, finish, err := t.send(req, holds && res != nil && *res != (shaper.Reservation{}), res, &handed)
	if err != nil {
		return resp, err
	}
	if resp.Request == nil {
		resp.Request = req
	}
	if t.feedback {
		var departed time.Time
		if res != nil {
			departed = res.Time()
		}
		t.learn(ctx, key, resp, departed)
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		t.refusedSpacing(ctx, key)
	}
	if tk != nil && !tk.none {
		if refused(resp) {
			// The partner counted nothing for a refused call: nor does
			// its reservation (a window or a bucket gives its units back).
			tk.mu.Lock()
			_ = tk.r.Settle(context.WithoutCancel(ctx), 0)
			tk.mu.Unlock()
		} else if t.usage != nil {
			resp.Body = usageOf(resp, tk, t.usage, ctx)
		}
	}
	if holds && res != nil && *res != (shaper.Reservation{}) && resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = releasing(resp.Body, res, ctx, finish)
		handed = true
	} else {
		finish()
	}
	return resp, nil
}

// space keeps the spacing margin on key (see WithSpacingMargin), renewed
// every half shaper.MarginSpan: one store call per key at most that often.
// The requests that come while it is set wait for it, so that none takes
// a slot spaced without it.
func (t *Transport) space(ctx context.Context, key string) {
	if t.margin <= 0 {
		return
	}
	sp, ok := t.r.(shaper.Spacer)
	if !ok {
		return
	}
	now := time.Now().UnixNano()
	v, ok := t.spaced.Load(key)
	if !t.always && (!ok || !v.(*spacing).refused.Load()) { // by default, only once the partner refused the key
		return
	}
	if !ok {
		v = t.spacingOf(key)
	}
	e := v.(*spacing)
	if now < e.next.Load() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if now < e.next.Load() {
		return
	}
	if err := sp.Space(context.WithoutCancel(ctx), key, t.margin); err == nil {
		e.next.Store(now + int64(shaper.MarginSpan/2))
	} else {
		e.next.Store(now + int64(time.Second)) // try again in a second, not with every request
	}
}

// refusedSpacing starts the default margin on key, refused by its partner:
// the next request of it sets it (see space). A key whose rate is learned
// is left alone: learning measures the partner by its refusals, and a
// margin it set itself would read as the partner's limit.
func (t *Transport) refusedSpacing(ctx context.Context, key string) {
	if t.margin <= 0 || t.always {
		return
	}
	if v, ok := t.spaced.Load(key); ok && v.(*spacing).refused.Load() {
		return
	}
	if sr, ok := t.r.(shaper.StatusReader); ok {
		if st, err := sr.Status(context.WithoutCancel(ctx), key, 1); err == nil && st.Learned != nil {
			return
		}
	}
	t.spacingOf(key).refused.Store(true)
}

// spacingOf returns key's spacing entry, made if need be; every 1,024 new
// entries it forgets the keys no longer used: no margin in force, and no
// request for a minute.
func (t *Transport) spacingOf(key string) *spacing {
	if v, ok := t.spaced.Load(key); ok {
		return v.(*spacing)
	}
	v, loaded := t.spaced.LoadOrStore(key, &spacing{})
	if !loaded && t.nspaced.Add(1)%1024 == 0 {
		now := time.Now()
		t.spaced.Range(func(k, v any) bool {
			e := v.(*spacing)
			e.lmu.Lock()
			idle := now.Sub(e.lastSlot) > time.Minute
			e.lmu.Unlock()
			if next := e.next.Load(); next < now.UnixNano() && idle {
				t.spaced.CompareAndDelete(k, v)
			}
			return true
		})
	}
	return v.(*spacing)
}

// spacing is a key's margin: when it is due for renewal (unix ns; 0:
// never set), and the lock its renewal holds; and how late this process's
// last request of the key reached the wire after its slot.
type spacing struct {
	mu      sync.Mutex
	next    atomic.Int64 // 0: not spaced yet
	refused atomic.Bool  // the partner refused a request of the key (refusedSpacing)

	lmu      sync.Mutex
	lastSlot time.Time
	late     time.Duration
}

// maxCatchUp bounds how long keepSpacing holds a request after its slot.
const maxCatchUp = 50 * time.Millisecond

// keepSpacing keeps this process's requests of key from reaching the
// wire closer together than their slots by more than the margin: a
// request whose predecessor was written late (a new connection's dial, a
// stalled goroutine) waits until its own slot plus that lateness less
// the margin, so that a late request followed by an on-time one does not
// arrive too close to it at a strict partner (at most maxCatchUp). It
// returns req with a trace that records when its headers are written.
func (t *Transport) keepSpacing(req *http.Request, key string, res *shaper.Reservation) (*http.Request, error) {
	if t.margin <= 0 {
		return req, nil
	}
	e := t.spacingOf(key)
	clock, slot := res.Clock(), res.Time()
	e.lmu.Lock()
	hold := min(e.late-t.margin, maxCatchUp)
	e.lmu.Unlock()
	if d := slot.Add(hold).Sub(clock.Now()); hold > 0 && d > 0 {
		tm := clock.NewTimer(d)
		select {
		case <-tm.C():
		case <-req.Context().Done():
			tm.Stop()
			return req, req.Context().Err()
		}
	}
	trace := &httptrace.ClientTrace{WroteHeaders: func() {
		late := clock.Now().Sub(slot)
		if late < 0 || late > time.Second { // another clock's slot: nothing to learn
			return
		}
		e.lmu.Lock()
		if !slot.Before(e.lastSlot) {
			e.lastSlot, e.late = slot, late
		}
		e.lmu.Unlock()
	}}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace)), nil
}

// holdsPermits reports whether the Reserver's reservations of key hold an
// in-flight permit (see shaper.PermitHolder).
func (t *Transport) holdsPermits(key string) bool {
	h, ok := t.r.(shaper.PermitHolder)
	return ok && h.HoldsPermits(key)
}

// wait reserves the slot and sleeps until it, within WithMaxWait. It
// returns the reservation when the Reserver tells it (see shaper.Acquirer).
func (t *Transport) wait(ctx context.Context, key string, cost int64, holds bool) (*shaper.Reservation, error) {
	if t.maxWait <= 0 {
		return t.acquire(ctx, key, cost, holds)
	}
	wctx, cancel := context.WithTimeout(ctx, t.maxWait)
	defer cancel()
	res, err := t.acquire(wctx, key, cost, holds)
	if err == nil || ctx.Err() != nil {
		return res, err
	}
	// wctx's deadline, not the caller's, refused the slot: that is MaxWait.
	var de *shaper.DeadlineError
	if errors.As(err, &de) {
		if dl, ok := ctx.Deadline(); !ok || de.Delay <= time.Until(dl) {
			return nil, &shaper.QueueFullError{Key: key, Delay: de.Delay, MaxQueue: t.maxWait}
		}
	}
	// A wait for a permit that MaxWait ended: no permit came in time.
	if holds && errors.Is(err, context.DeadlineExceeded) && wctx.Err() != nil {
		return nil, &shaper.QueueFullError{Key: key, MaxQueue: t.maxWait, InFlight: true}
	}
	return nil, err
}

func (t *Transport) acquire(ctx context.Context, key string, cost int64, holds bool) (*shaper.Reservation, error) {
	a, ok := t.r.(shaper.Acquirer)
	if !ok {
		if holds { // Wait would take a permit no one could release
			return t.reserveHolding(ctx, key, cost)
		}
		return nil, t.r.Wait(ctx, key, cost)
	}
	res, err := a.Acquire(ctx, key, cost)
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// reserveHolding is acquire on a Reserver that holds permits but has no
// Acquire method: Reserve takes a permit only if one is free (else it
// refuses, a *shaper.QueueFullError with InFlight set), then the request
// sleeps until its slot, on the clock of the shaper that granted it. A
// slot after ctx's deadline, or a ctx that ends while it sleeps, gives the
// slot and the permit back.
func (t *Transport) reserveHolding(ctx context.Context, key string, cost int64) (*shaper.Reservation, error) {
	res, err := t.r.Reserve(ctx, key, cost)
	if err != nil {
		return nil, err
	}
	giveBack := func() {
		bg := context.WithoutCancel(ctx)
		_ = res.Cancel(bg)
		_ = res.Release(bg)
	}
	if res.Delay <= 0 {
		return &res, nil
	}
	if dl, ok := ctx.Deadline(); ok && res.Delay > time.Until(dl) {
		giveBack()
		return nil, &shaper.DeadlineError{Key: key, Delay: res.Delay, Deadline: dl}
	}
	clock := res.Clock()
	if d := res.Time().Sub(clock.Now()); d > 0 {
		tm := clock.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C():
		case <-ctx.Done():
			giveBack()
			return nil, ctx.Err()
		}
	}
	return &res, nil
}

// ticketKey is the context key under which a request sent by a Transport
// carries the reservation it departed on.
type ticketKey struct{}

type ticket struct {
	mu   sync.Mutex
	r    shaper.Reservation
	none bool // r is the zero Reservation: the Reserver returned no reservation
}

// refused reports whether resp refuses its call and says when to come
// back: a 429 or a 503 with Retry-After. The partner counted nothing for
// it, and the key pauses until then (a bare 429 keeps its slot counted:
// the partner found the key too fast, and the slot slows it a little).
func refused(resp *http.Response) bool {
	return (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) &&
		resp.Header.Get("Retry-After") != ""
}

// Settle records the actual cost of the call that resp answers, once the
// caller has read it (an LLM API's token usage in the body, say), on the
// reservation the Transport made for it with WithCost's estimate (see
// shaper.Reservation.Settle: less gives the difference back, more is
// charged). With go-retryablehttp it settles the last attempt's. A response
// that did not come through a Transport whose Reserver returns its
// reservations (a *shaper.Shaper, or Route and otelshaper.Wrap over one, however
// nested) fails with a *shaper.ConfigError, and so does one whose Reserver
// only waited: Route or otelshaper.Wrap over a Reserver without an Acquire method
// have no reservation to settle. A reservation is settled once: settling it
// again returns shaper.ErrSettled, and so does settling a refused call's (a
// 429 or a 503 with Retry-After), which the Transport settles at nothing,
// or one WithUsage settled.
func Settle(ctx context.Context, resp *http.Response, actual int64) error {
	var tk *ticket
	if resp != nil && resp.Request != nil {
		tk, _ = resp.Request.Context().Value(ticketKey{}).(*ticket)
	}
	if tk == nil {
		return &shaper.ConfigError{Algorithm: "transport", Field: "Settle", Value: nil,
			Reason: "the response did not come through a Transport whose Reserver returns its reservations"}
	}
	if tk.none {
		return &shaper.ConfigError{Algorithm: "transport", Field: "Settle", Value: nil,
			Reason: "the Transport's Reserver returned no reservation to settle (Route or otelshaper.Wrap over a Reserver without an Acquire method only wait)"}
	}
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return tk.r.Settle(ctx, actual)
}

// learn gives the partner's feedback on resp to the Reserver (see
// Feedback): a learning shaper tunes the key's rate by it, any shaper
// pauses and clamps the key as the partner asks. departed is the
// request's slot (zero: unknown).
func (t *Transport) learn(ctx context.Context, key string, resp *http.Response, departed time.Time) {
	fb := Feedback(resp, time.Now())
	fb.Departed = departed
	fb.Pause = min(fb.Pause, t.maxPause, shaper.MaxPause)
	// A count is spread until its own reset, however far: cut to
	// maxPause it would be spent faster than it allows. maxPause bounds
	// how long the partner may stop the key, not how slowly it paces it.
	fb.Reset = min(fb.Reset, shaper.MaxPause)
	// The caller's ctx may end with this response; what it taught must not.
	ctx = context.WithoutCancel(ctx)
	if l, ok := t.r.(shaper.Learner); ok {
		_ = l.Learn(ctx, key, fb)
		return
	}
	if fb.Pause > 0 {
		_ = t.r.Pause(ctx, key, fb.Pause)
		return
	}
	// Calls left, but fewer than the contract would send before the reset:
	// the fleet spreads them over it (see shaper.Shaper.Clamp).
	if fb.HasRemaining {
		if c, ok := t.r.(shaper.Clamper); ok {
			_ = c.Clamp(ctx, key, fb.Remaining, fb.Reset)
		}
	}
}

// Feedback reads what resp tells of its key's limits, at now (see
// shaper.Feedback; Departed is left zero):
//
//   - Refused: a refusal for the partner's rate. A 429; a 403 with
//     Retry-After or with headers saying a limit has nothing left (GitHub
//     answers its primary and secondary limits so). A 403 without either
//     is an authorization error, not a refusal. A 503 is the partner
//     unavailable, not its rate refusing: it only pauses.
//   - Pause: a refusal's or a 503's Retry-After (retry-after-ms too);
//     and, on any response, for any dimension (requests, tokens) the
//     headers say has nothing left, the time until its reset; the longest
//     of them.
//   - Remaining and Reset: the request limit with the fewest requests
//     left per second of its reset, when some are left.
//   - Policy: the slowest request quota per window the partner states
//     (RateLimit-Policy, and the quota and window of the dialects that
//     state both, see Limit.Rate), whatever is left of it: a limit with
//     nothing left states its quota too.
//
// Every dialect ParseLimits reads counts; malformed fields are ignored.
func Feedback(resp *http.Response, now time.Time) shaper.Feedback {
	var fb shaper.Feedback
	if resp == nil {
		return fb
	}
	limits := ParseLimits(resp.Header, now)
	wait, hasWait := RetryAfter(resp.Header, now)
	exhausted := false
	for _, l := range limits {
		exhausted = exhausted || l.HasRemaining && l.Remaining < 1
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		fb.Refused = true
	case http.StatusForbidden:
		fb.Refused = hasWait || exhausted
	}
	// A 503 is the partner unavailable, not its rate refusing: it pauses
	// (with Retry-After) and measures nothing, or a storm of them would
	// take a learning key's rate down with each.
	if hasWait && (fb.Refused || resp.StatusCode == http.StatusServiceUnavailable) {
		fb.Pause = wait
	}
	policy := math.Inf(1)
	for _, l := range limits {
		switch {
		case l.HasRemaining && l.Remaining < 1:
			if l.HasReset {
				fb.Pause = max(fb.Pause, l.Reset)
			}
		case l.Dimension == Requests && l.HasRemaining && l.HasReset && l.Reset > 0:
			n := math.Floor(min(l.Remaining, math.MaxInt64/2))
			// Tighter: fewer calls per unit of time.
			if !fb.HasRemaining || n*fb.Reset.Seconds() < float64(fb.Remaining)*l.Reset.Seconds() {
				fb.Remaining, fb.Reset, fb.HasRemaining = int64(n), l.Reset, true
			}
		}
		if l.Dimension != Requests {
			continue
		}
		if r, ok := l.Rate(); ok && r < policy && l.Quota >= 1 && l.Quota < math.MaxInt64/2 {
			policy = r
			fb.Policy = shaper.Rate{Count: int64(l.Quota), Period: l.Window}
		}
	}
	return fb
}

// CloseIdleConnections closes the base transport's idle connections, if it
// can (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.baseRT().(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
