package algorithms

import "math"

// Dim is one dimension of a multi-dimension limit for [All]: an algorithm, the
// state of its key, and the cost of the request in that dimension's units
// (for example 1 request, or 700 tokens).
type Dim struct {
	Alg   Algorithm
	State State
	Cost  int64
}

// AllDecision is the outcome of [All].
type AllDecision struct {
	Decision
	// Binding is the index of the dimension that determined the decision
	// (see [Peek] for the rule), or -1 when a pause floor did. On a cost
	// error, the dimension that refused it.
	Binding int
	// Wait is Delay (admitted) or RetryAfter (refused) in unrounded
	// milliseconds, as the Lua form computes it.
	Wait float64
	// Took has bit i set for each dimension i that committed: every one
	// for an admitted All, those that admitted the request for [AnyWithin],
	// none for a refusal.
	Took uint64
}

// All reserves cost in every dimension at once, or in none. The request
// departs at the earliest instant at which every dimension conforms (the
// latest of their earliest instants: conformance never lapses by waiting, for
// every algorithm here). It is admitted when that instant is no further away
// than the smallest MaxWait of the dimensions, and then every dimension
// commits the same departure; otherwise nothing is written.
//
// The new states are written back into dims[i].State, which may share the
// backing arrays of the old ones. On refusal and on error they are untouched.
// Decision.Remaining and Decision.ResetAfter are those of the binding
// dimension. All panics if dims is empty.
func All(dims []Dim, now float64) (AllDecision, error) {
	return AllNotBefore(dims, now, now)
}

// AllNotBefore is [All] for keys that nobody may leave before notBefore (see
// [ReserveNotBefore]). When the floor is what delays the request, Binding is
// -1.
func AllNotBefore(dims []Dim, now, notBefore float64) (AllDecision, error) {
	return AllWithin(dims, now, notBefore, math.Inf(1))
}

// AllWithin is [AllNotBefore] for a caller that waits at most maxWait ms (a
// deadline): a request whose departure is further away is refused, as one
// past the dimensions' MaxWait is, and nothing is written.
func AllWithin(dims []Dim, now, notBefore, maxWait float64) (AllDecision, error) {
	if len(dims) == 0 {
		panic("throttlekit: algorithms.All with no dimensions")
	}
	if !finite(now) || !finite(notBefore) {
		return AllDecision{}, ErrInvalidTime
	}
	maxWait = min(maxWait, dims[0].Alg.MaxWait())
	for i := range dims {
		if err := dims[i].Alg.ValidateCost(dims[i].Cost); err != nil {
			return AllDecision{Binding: i}, err
		}
		maxWait = min(maxWait, dims[i].Alg.MaxWait())
	}
	wait, binding := pick(dims, now)
	floored := notBefore-now > wait
	if floored {
		wait = notBefore - now
	}
	b := &dims[binding]
	if wait > maxWait {
		rem, reset := b.Alg.Status(b.State, now)
		return AllDecision{makeDecision(false, wait-maxWait, rem, reset), bindingOr(floored, binding), wait - maxWait, 0}, nil
	}
	for i := range dims {
		dims[i].State = dims[i].Alg.Commit(dims[i].State, now, wait, dims[i].Cost)
	}
	rem, reset := b.Alg.Status(b.State, now)
	return AllDecision{makeDecision(true, wait, rem, reset), bindingOr(floored, binding), wait, 1<<len(dims) - 1}, nil
}

func bindingOr(floor bool, binding int) int {
	if floor {
		return -1
	}
	return binding
}

// pick returns the wait of dims at now and the binding dimension: the one
// whose earliest conforming instant is latest; on a tie, the one with the
// fewest requests of its cost left (remaining/cost), then the first. A
// dimension of cost 0 takes no part.
func pick(dims []Dim, now float64) (wait float64, binding int) {
	wait, room := -1.0, math.NaN()
	for i := range dims {
		d := &dims[i]
		if d.Cost == 0 {
			continue
		}
		w := d.Alg.Delay(d.State, now, d.Cost)
		switch {
		case w > wait:
			wait, binding, room = w, i, math.NaN()
		case w == wait:
			if room != room {
				room = headroom(&dims[binding], now)
			}
			if h := headroom(d, now); h < room {
				binding, room = i, h
			}
		}
	}
	return max(wait, 0), binding
}

// headroom is how many requests of d's cost d has left at now.
func headroom(d *Dim, now float64) float64 {
	rem, _ := d.Alg.Status(d.State, now)
	return rem / float64(d.Cost)
}

// Standing is one dimension's figures at an instant (see [Peek]), in
// milliseconds after it.
type Standing struct {
	Delay     float64 // until the dimension's request could first depart (0 for cost 0)
	Remaining float64 // units that could be admitted at once (not floored)
	Reset     float64 // until the dimension's state is equivalent to a cold key
}

// Peek reports, without changing anything, what [AllNotBefore] would
// decide for dims at now: each dimension's [Standing], written to out
// (len(dims) long), and the binding dimension, -1 when the floor
// notBefore comes later than every dimension's delay. The binding
// dimension is the one whose earliest conforming instant is latest; on a
// tie (every dimension admitting at once, typically) the one with the
// fewest requests of its cost left, then the first. A dimension of cost 0
// is reported but takes no part. Costs are not validated.
func Peek(dims []Dim, now, notBefore float64, out []Standing) (binding int) {
	for i := range dims {
		d := &dims[i]
		out[i] = Standing{}
		if d.Cost > 0 {
			out[i].Delay = d.Alg.Delay(d.State, now, d.Cost)
		}
		out[i].Remaining, out[i].Reset = d.Alg.Status(d.State, now)
	}
	wait, binding := pick(dims, now)
	if notBefore-now > wait {
		return -1
	}
	return binding
}
