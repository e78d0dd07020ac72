package algorithms

// TokenBucket holds up to Burst tokens and refills continuously at Count per
// Period, computed lazily from the elapsed time. A cold key starts full. A
// request of cost c is admitted when at least c tokens are present; it never
// waits (Wait on a token bucket sleeps until RetryAfter and tries again).
//
// A clock that steps backwards refills nothing until it passes the last
// update again, so it never over-admits.
//
// The level is kept as credit, tokens times Period in ms: a refill adds
// elapsed*Count, a request takes cost*Period, and a request is admitted when
// the credit is at least cost*Period. With whole (or dyadic) milliseconds of
// elapsed time, a whole (or dyadic) Count and a Period of whole
// milliseconds, every one of those figures is a float64 integer (or a short
// dyadic fraction), so the bucket decides exactly as exact arithmetic does:
// 3 tokens per second refilled over 100 ms steps reach exactly 3, where
// adding 0.3 token ten times gives 2.9999999999999996. Elsewhere each step
// rounds once, relative error 2^-53 of the credit.
//
// State layout: [credit, last update (ms), Period (ms)], credit being
// tokens*Period. A state of another Period (the rate changed live) is read
// through its tokens, credit/Period; the earlier layout [tokens, last
// update] is read as tokens too.
type TokenBucket struct {
	interval float64 // ms per token (Params only)
	burst    float64
	count    float64 // tokens per period
	period   float64 // ms
}

// NewTokenBucket returns a token bucket of capacity r.Burst refilling at
// r.Count per r.Period.
func NewTokenBucket(r Rate) (*TokenBucket, error) {
	t, err := validateRate("token-bucket", r.Count, r.Period)
	if err != nil {
		return nil, err
	}
	b, err := validateBurst("token-bucket", r.Burst)
	if err != nil {
		return nil, err
	}
	return &TokenBucket{interval: t, burst: b, count: r.Count, period: DurationMillis(r.Period)}, nil
}

// Name returns "token-bucket".
func (*TokenBucket) Name() string { return "token-bucket" }

// MaxWait returns 0: the token bucket never queues.
func (*TokenBucket) MaxWait() float64 { return 0 }

// ValidateCost refuses costs below 1 and above the capacity.
func (b *TokenBucket) ValidateCost(cost int64) error {
	return checkCost("token-bucket", cost, b.burst, "the capacity (burst)")
}

// level returns the credit (tokens*period) at now and the update time to
// store.
func (b *TokenBucket) level(st State, now float64) (credit, last float64) {
	capacity := float64(b.burst * b.period)
	if len(st) < 2 {
		return capacity, now
	}
	credit, last = st[0], st[1]
	switch {
	case len(st) < 3: // [tokens, last]: the layout before credit
		credit = float64(credit * b.period)
	case st[2] != b.period: // stored under another period: its tokens carry over
		credit = float64(float64(credit/st[2]) * b.period)
	}
	if elapsed := now - last; elapsed > 0 {
		credit += float64(elapsed * b.count)
		last = now
	}
	if credit > capacity { // a burst lowered live (a state of a larger bucket) holds at once
		credit = capacity
	}
	return credit, last
}

// Delay returns 0 if enough tokens are present, else the time until the
// bucket will have refilled to cost.
func (b *TokenBucket) Delay(st State, now float64, cost int64) float64 {
	credit, _ := b.level(st, now)
	need := float64(float64(cost) * b.period)
	if credit >= need {
		return 0
	}
	return (need - credit) / b.count
}

// Commit takes cost tokens. delay is ignored: token buckets commit only at now.
func (b *TokenBucket) Commit(st State, now, _ float64, cost int64) State {
	credit, last := b.level(st, now)
	return set3(st, credit-float64(float64(cost)*b.period), last, b.period)
}

// Params returns "t": interval, capacity, count, period (ms).
func (b *TokenBucket) Params() (string, [6]float64) {
	return "t", [6]float64{b.interval, b.burst, b.count, b.period}
}

// Status returns the tokens present and the time until the bucket is full.
// After a clock step backwards the refill resumes only once the clock passes
// the last update again, so that wait counts too.
func (b *TokenBucket) Status(st State, now float64) (remaining, resetAfter float64) {
	credit, last := b.level(st, now)
	return credit / b.period, (last - now) + (float64(b.burst*b.period)-credit)/b.count
}

// set2 stores a two-number state, reusing st's array when it can.
func set2(st State, a, b float64) State {
	if cap(st) < 2 {
		return append(st[:0], a, b)
	}
	st = st[:2]
	st[0], st[1] = a, b
	return st
}

// set3 stores a three-number state, reusing st's array when it can.
func set3(st State, a, b, c float64) State {
	if cap(st) < 3 {
		return append(st[:0], a, b, c)
	}
	st = st[:3]
	st[0], st[1], st[2] = a, b, c
	return st
}
