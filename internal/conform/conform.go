// Package conform checks a key's departures against a GCRA contract by the
// contract's definition, for the tests of the packages that grant them. It
// shares no code with them, so that a test of the library's rule is not the
// rule checking itself.
package conform

import (
	"math"
	"slices"
)

// Departure is one call as the partner sees it: its instant (ms) and its
// actual cost.
type Departure struct {
	At   float64
	Cost int64
}

// Check replays deps in time order through GCRA with interval T and
// tolerance tau (ms), a cost above the burst spread over the time before
// its departure: R = max(R, t - max(0, T*c - tau)) + T*c must never pass
// t + tau (give or take 100 ns: slots are rounded to the nanosecond). It
// returns the first departure, in time order, that does not fit, and false;
// or true.
func Check(interval, tau float64, deps []Departure) (Departure, bool) {
	deps = slices.Clone(deps)
	slices.SortStableFunc(deps, func(a, b Departure) int {
		switch {
		case a.At < b.At:
			return -1
		case a.At > b.At:
			return 1
		}
		return 0
	})
	r := math.Inf(-1)
	for _, d := range deps {
		if d.Cost == 0 {
			continue
		}
		tc := interval * float64(d.Cost)
		r = math.Max(r, d.At-math.Max(0, tc-tau)) + tc
		if r > d.At+tau+1e-4 {
			return d, false
		}
	}
	return Departure{}, true
}
