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

// MostWeightInOneSecond returns the largest sum of weights (weights[i] for
// ts[i], in order) that falls in any half-open 1 s window: the most tokens
// a partner saw in one second, say.
func MostWeightInOneSecond(ts []time.Time, weights []int64) int64 {
	var most, sum int64
	j := 0
	for i := range ts {
		sum += weights[i]
		for ts[i].Sub(ts[j]) >= time.Second {
			sum -= weights[j]
			j++
		}
		most = max(most, sum)
	}
	return most
}
