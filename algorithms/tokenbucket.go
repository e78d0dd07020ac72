package algorithms

// TokenBucket holds up to Burst tokens and refills continuously at Count per
// Period, computed lazily from the elapsed time. A cold key starts full. A
// request of cost c is admitted when at least c tokens are present; it never
// waits (Wait on a token bucket sleeps until RetryAfter and tries again).
//
// A clock that steps backwards refills nothing until it passes the last
// update again, so it never over-admits.
//
// State layout: [tokens, last update (ms)].
type TokenBucket struct {
	interval float64 // ms per token
	burst    float64
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
	return &TokenBucket{interval: t, burst: b}, nil
}

// Name returns "token-bucket".
func (*TokenBucket) Name() string { return "token-bucket" }

// MaxWait returns 0: the token bucket never queues.
func (*TokenBucket) MaxWait() float64 { return 0 }

// ValidateCost refuses costs below 1 and above the capacity.
func (b *TokenBucket) ValidateCost(cost int64) error {
	return checkCost("token-bucket", cost, b.burst, "the capacity (burst)")
}

// level returns the tokens present at now and the update time to store.
func (b *TokenBucket) level(st State, now float64) (tokens, last float64) {
	if len(st) < 2 {
		return b.burst, now
	}
	tokens, last = st[0], st[1]
	if elapsed := now - last; elapsed > 0 {
		tokens += elapsed / b.interval
		last = now
	}
	if tokens > b.burst { // a burst lowered live (a state of a larger bucket) holds at once
		tokens = b.burst
	}
	return tokens, last
}

// Delay returns 0 if enough tokens are present, else the time until the
// bucket will have refilled to cost.
func (b *TokenBucket) Delay(st State, now float64, cost int64) float64 {
	tokens, _ := b.level(st, now)
	c := float64(cost)
	if tokens >= c {
		return 0
	}
	return float64((c - tokens) * b.interval)
}

// Commit takes cost tokens. delay is ignored: token buckets commit only at now.
func (b *TokenBucket) Commit(st State, now, _ float64, cost int64) State {
	tokens, last := b.level(st, now)
	return set2(st, tokens-float64(cost), last)
}

// Params returns "t": interval, capacity.
func (b *TokenBucket) Params() (string, [6]float64) { return "t", [6]float64{b.interval, b.burst} }

// Status returns the tokens present and the time until the bucket is full.
// After a clock step backwards the refill resumes only once the clock passes
// the last update again, so that wait counts too.
func (b *TokenBucket) Status(st State, now float64) (remaining, resetAfter float64) {
	tokens, last := b.level(st, now)
	return tokens, (last - now) + float64((b.burst-tokens)*b.interval)
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
