// Package window measures what a partner sees in the examples: the most
// arrivals in any 1 s window, the figure a per-second contract is about.
package window

import "time"

// MostInOneSecond returns the most instants of ts, in order, that fall in
// any half-open 1 s window.
func MostInOneSecond(ts []time.Time) int {
	most, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}
