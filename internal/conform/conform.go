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
//
// A call settled for more than it reserved (an overrun) says so with
// Reserved, the cost it was granted with, and Settled, when its settle
// came; Granted says when each departure was granted, on the same scale
// (the order of the operations of a run). Departures without them (zero)
// are judged with their cost alone.
type Departure struct {
	At   float64
	Cost int64
	// Reserved is the cost the call was granted with, when it was settled
	// for more (Cost > Reserved > 0); 0 otherwise.
	Reserved int64
	// Granted is when the departure was granted; Settled, when an overrun
	// was settled: an overrun settled after a departure was granted counts
	// at its reserved cost when that departure is judged.
	Granted, Settled int
}

// overran reports whether d was settled for more than it was granted with.
func (d Departure) overran() bool { return d.Reserved > 0 && d.Cost > d.Reserved }

// Check replays deps in time order (ties in the order given) through GCRA
// with interval T and tolerance tau (ms), a cost above the burst spread
// over the time before its departure: R = max(R, t - max(0, T*c - tau)) +
// T*c must never pass t + tau (give or take 100 ns: slots are rounded to
// the nanosecond). It returns the first departure, in time order, that does
// not fit, and false; or true.
//
// An overrun is charged, never refused: the library learns of it only at
// its settle, and the slots granted before that keep their times. So each
// departure is judged in the replay of what was known when it was granted:
// every departure at its final cost, except the overruns settled after its
// grant, at their reserved cost. A slot granted after an overrun was
// settled must make room for it; one granted before need not.
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
	// The overruns known when a departure was granted are those settled
	// at or before its grant: view v knows the first v of them.
	var settles []int
	for _, d := range deps {
		if d.overran() {
			settles = append(settles, d.Settled)
		}
	}
	slices.Sort(settles)
	views := make([]int, len(deps))
	used := map[int]bool{}
	for i, d := range deps {
		views[i], _ = slices.BinarySearch(settles, d.Granted+1) // how many were settled at or before it
		used[views[i]] = true
	}
	bad := len(deps)
	for v := range used {
		r := math.Inf(-1)
		for i, d := range deps[:bad] {
			c := d.Cost
			if d.overran() && (v == 0 || d.Settled > settles[v-1]) { // not known yet in view v
				c = d.Reserved
			}
			if c == 0 {
				continue
			}
			tc := interval * float64(c)
			r = math.Max(r, d.At-math.Max(0, tc-tau)) + tc
			if r > d.At+tau+1e-4 && views[i] == v {
				bad = i
				break
			}
		}
	}
	if bad < len(deps) {
		return deps[bad], false
	}
	return Departure{}, true
}
