package algorithms

import "math"

// MaxAnyDims is the most dimensions [AnyWithin] combines.
const MaxAnyDims = 64

// AnyWithin combines dimensions of which any one may admit a request (the
// "any" combinator), where [AllWithin] needs every one. The request departs
// at the earliest instant at which some dimension conforms, and no earlier
// than notBefore; it is admitted when that is no further away than maxWait
// and the smallest MaxWait of the dimensions. Then every dimension that
// conforms at that instant commits it, and only those (Took says which);
// a refusal writes nothing.
//
// The binding dimension of an admission is the admitting one with the most
// requests of its cost left (remaining/cost, before it commits; the first
// on a tie), or -1 when the floor set the departure; Remaining and
// ResetAfter are its figures after the commit. That of a refusal is the
// dimension that admits soonest. Every cost must be valid for its
// dimension (the caller leaves out a dimension that could never admit
// it); dims holds 1 to MaxAnyDims dimensions.
func AnyWithin(dims []Dim, now, notBefore, maxWait float64) (AllDecision, error) {
	if len(dims) == 0 || len(dims) > MaxAnyDims {
		panic("throttlekit: algorithms.AnyWithin with no dimensions or more than MaxAnyDims")
	}
	if !finite(now) || !finite(notBefore) {
		return AllDecision{}, ErrInvalidTime
	}
	for i := range dims {
		if err := dims[i].Alg.ValidateCost(dims[i].Cost); err != nil {
			return AllDecision{Binding: i}, err
		}
		maxWait = min(maxWait, dims[i].Alg.MaxWait())
	}
	var delays [MaxAnyDims]float64
	wait, soonest := math.Inf(1), 0
	for i := range dims {
		delays[i] = dims[i].Alg.Delay(dims[i].State, now, dims[i].Cost)
		if delays[i] < wait {
			wait, soonest = delays[i], i
		}
	}
	floored := notBefore-now > wait
	if floored {
		wait = notBefore - now
	}
	if wait > maxWait {
		b := &dims[soonest]
		rem, reset := b.Alg.Status(b.State, now)
		return AllDecision{makeDecision(false, wait-maxWait, rem, reset), bindingOr(floored, soonest), wait - maxWait, 0}, nil
	}
	best, room := soonest, math.Inf(-1)
	for i := range dims {
		if delays[i] <= wait {
			if h := headroom(&dims[i], now); h > room {
				best, room = i, h
			}
		}
	}
	var took uint64
	for i := range dims {
		if delays[i] <= wait {
			dims[i].State = dims[i].Alg.Commit(dims[i].State, now, wait, dims[i].Cost)
			took |= 1 << i
		}
	}
	b := &dims[best]
	rem, reset := b.Alg.Status(b.State, now)
	return AllDecision{makeDecision(true, wait, rem, reset), bindingOr(floored, best), wait, took}, nil
}

// PeekAny is [Peek] for [AnyWithin]: each dimension's standing, and the
// dimension AnyWithin would name as binding: -1 when the floor comes later
// than every dimension's delay; the one that admits soonest when that is
// past the dimensions' MaxWait; otherwise the admitting one with the most
// requests of its cost left. A dimension of cost 0 is reported but takes
// no part.
func PeekAny(dims []Dim, now, notBefore float64, out []Standing) (binding int) {
	wait, soonest, maxWait := math.Inf(1), 0, math.Inf(1)
	for i := range dims {
		d := &dims[i]
		out[i] = Standing{}
		out[i].Remaining, out[i].Reset = d.Alg.Status(d.State, now)
		if d.Cost == 0 {
			continue
		}
		maxWait = min(maxWait, d.Alg.MaxWait())
		out[i].Delay = d.Alg.Delay(d.State, now, d.Cost)
		if out[i].Delay < wait {
			wait, soonest = out[i].Delay, i
		}
	}
	if notBefore-now > wait {
		return -1
	}
	if wait > maxWait {
		return soonest
	}
	best, room := soonest, math.Inf(-1)
	for i := range dims {
		if dims[i].Cost != 0 && out[i].Delay <= wait {
			if h := out[i].Remaining / float64(dims[i].Cost); h > room {
				best, room = i, h
			}
		}
	}
	return best
}
