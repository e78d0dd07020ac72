package shaper

import (
	"context"
	"fmt"
	"slices"
)

// Costs is a call's cost in the dimensions that count it apart from the
// others, by dimension name: a partner that limits input and output tokens
// each on its own (Anthropic's input and output tokens per minute) is
// reserved as Costs{"input-tokens": prompt, "output-tokens": maxTokens}
// and settled as Costs{"output-tokens": usage}. Put it on the context with
// WithCosts.
type Costs map[string]int64

type costsKey struct{}

// WithCosts returns ctx carrying costs, the call's cost in each dimension
// it names. Reserve, Acquire, Wait and Status on ctx charge those
// dimensions their cost in costs instead of the cost argument (mapped by
// the dimension's Cost); the dimensions it does not name take the cost
// argument as before. Settle on ctx settles each named dimension at its
// cost in costs, the rest at the actual argument: a context that still
// carries the reservation's costs settles the named dimensions at their
// reservation, giving nothing back. A cost of 0 leaves a dimension out of
// the request; a negative cost, or a name that is none of the shaper's
// dimensions, is a *CostError. Only a shaper of several dimensions (All,
// Any, or one whose dimension maps keys or costs) reads costs: a shaper
// of one dimension charges the cost argument.
func WithCosts(ctx context.Context, costs Costs) context.Context {
	return context.WithValue(ctx, costsKey{}, costs)
}

// costsOf returns the costs ctx carries (nil: none, or a shaper of one
// dimension), checked against c's dimensions.
func (s *Shaper) costsOf(ctx context.Context, c *contract, key string) (Costs, error) {
	if s.single {
		return nil, nil
	}
	cs, _ := ctx.Value(costsKey{}).(Costs)
	for name, n := range cs {
		i := slices.IndexFunc(c.dims, func(d *dim) bool { return d.Name == name })
		if i < 0 {
			return nil, &CostError{Algorithm: "costs", Cost: n, Key: key, Dimension: name, Reason: "names none of the shaper's dimensions"}
		}
		if n < 0 {
			return nil, &CostError{Algorithm: c.dims[i].Alg.Name(), Cost: n, Key: key, Dimension: name, Reason: "must be >= 0"}
		}
	}
	return cs, nil
}

// mapCost is d's share of a call of cost: its own in cs if cs names it,
// else cost mapped through d's Cost (nil: unchanged). 0 leaves d out of
// the request, and a negative cost is a *CostError.
func mapCost(cs Costs, d *dim, key string, cost int64) (int64, error) {
	if n, ok := cs[d.Name]; ok {
		return n, nil
	}
	if d.cost == nil {
		return cost, nil
	}
	c := d.cost(cost)
	if c < 0 {
		return 0, &CostError{Algorithm: d.Alg.Name(), Cost: c, Key: key, Dimension: d.Name, Reason: fmt.Sprintf("the dimension's Cost mapped cost %d to a negative cost", cost)}
	}
	return c, nil
}
