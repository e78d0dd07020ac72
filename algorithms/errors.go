package algorithms

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns matches exactly one of
// them with errors.Is.
var (
	// ErrInvalidConfig is matched by every *ConfigError.
	ErrInvalidConfig = errors.New("throttlekit: invalid configuration")
	// ErrInvalidCost is matched by every *CostError.
	ErrInvalidCost = errors.New("throttlekit: invalid cost")
	// ErrInvalidTime is returned when a transition is given a NaN or infinite instant.
	ErrInvalidTime = errors.New("throttlekit: invalid time (NaN or infinite)")
)

// ConfigError reports a configuration value that a constructor refused.
type ConfigError struct {
	Algorithm string // e.g. "gcra"
	Field     string // e.g. "Count"
	Value     any    // the value given
	Reason    string // what was expected
}

// Error says which algorithm refused which field, the value, and what was expected.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("throttlekit: %s: invalid %s %v: %s", e.Algorithm, e.Field, e.Value, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// CostError reports a cost that a transition refused before looking at state.
// Nothing is consumed.
type CostError struct {
	Algorithm string
	Cost      int64
	Reason    string
	// Key and Dimension name the caller's key and the dimension that refused
	// the cost, when the refusal comes through a shaper (package shaper);
	// empty otherwise. Dimension is empty for a shaper of one contract.
	Key       string
	Dimension string
}

// Error says which algorithm refused the cost and why.
func (e *CostError) Error() string {
	where := ""
	if e.Dimension != "" {
		where = fmt.Sprintf(" (dimension %q)", e.Dimension)
	}
	if e.Key != "" {
		where += fmt.Sprintf(" for key %q", e.Key)
	}
	return fmt.Sprintf("throttlekit: %s: invalid cost %d%s: %s", e.Algorithm, e.Cost, where, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidCost) true.
func (e *CostError) Unwrap() error { return ErrInvalidCost }

// maxExactCost is the largest cost whose float64 conversion is exact (2^53).
const maxExactCost = 1 << 53

// checkCost applies the checks every algorithm shares: cost >= 1, cost exactly
// representable, and cost <= limit (the most one request can ever be granted).
func checkCost(alg string, cost int64, limit float64, what string) error {
	switch {
	case cost <= 0:
		return &CostError{Algorithm: alg, Cost: cost, Reason: "must be >= 1"}
	case cost > maxExactCost:
		return &CostError{Algorithm: alg, Cost: cost, Reason: "must be <= 2^53"}
	case float64(cost) > limit:
		return &CostError{Algorithm: alg, Cost: cost, Reason: fmt.Sprintf("exceeds %s %v and could never be admitted", what, limit)}
	}
	return nil
}

// largest returns the largest cost in [0, 2^53] that ok accepts, for a
// predicate that accepts a prefix of the costs (every cost up to some bound):
// a binary search, exact where a division would round.
func largest(ok func(int64) bool) int64 {
	lo, hi := int64(0), int64(maxExactCost)
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// MaxCost returns the largest cost a accepts (see Algorithm.ValidateCost): the
// largest request that is ever admitted. It is exact: MaxCost(a) passes
// ValidateCost and MaxCost(a)+1 does not.
func MaxCost(a Algorithm) int64 {
	return largest(func(c int64) bool { return c >= 1 && a.ValidateCost(c) == nil })
}
