package algorithms

import (
	"math"
	"time"
)

// CostBucket is the schedule of a partner's token bucket of a call's cost
// (an LLM API's tokens, Anthropic's and Stripe's limits): a bucket of
// Capacity units refilled continuously at Count per Period, from which
// each departure takes its cost, and to which what a settled call did not
// use comes back, as the partner's bucket gives it back. Requests depart
// in the order they are granted, each as soon as the bucket holds its cost
// (a request that would wait more than the longest wait is refused).
//
// Unlike the GCRA, whose schedule may grant a slot before one granted
// earlier and so can give back only what no such slot depends on,
// departures here only move forward in time, and what is given back comes
// back into the bucket at the instant of the give-back: every departure
// granted later sees it, none granted earlier counted on it. The
// departures still ahead keep their instants, and the bucket's levels
// before them are recomputed with the units back, capacity and all, as
// the partner's bucket would hold them.
//
// State layout: [level after the newest departure, the newest departure
// (ms), then one quadruple per departure still ahead of now at the last
// change: departure (ms), its cost, and the level and instant the bucket
// was at before it (the departure before it, or a give-back)]. A cold key
// is a full bucket.
type CostBucket struct {
	capacity float64
	interval float64 // ms per unit
	maxWait  float64 // ms
}

// NewCostBucket returns the schedule of a bucket of capacity units refilled
// at count per period, waiting at most maxQueue (0: never wait).
func NewCostBucket(capacity float64, count int64, period, maxQueue time.Duration) (*CostBucket, error) {
	const name = "cost-bucket"
	if err := validateCount(name, capacity); err != nil {
		return nil, err
	}
	if err := validateLimit(name, float64(count), period); err != nil {
		return nil, err
	}
	if maxQueue < 0 {
		return nil, &ConfigError{name, "MaxQueue", maxQueue, "must be >= 0"}
	}
	return &CostBucket{capacity: capacity, interval: DurationMillis(period) / float64(count),
		maxWait: DurationMillis(maxQueue)}, nil
}

// Name returns "cost-bucket".
func (b *CostBucket) Name() string { return "cost-bucket" }

// ValidateCost refuses costs below 1 and above the capacity.
func (b *CostBucket) ValidateCost(cost int64) error {
	return checkCost(b.Name(), cost, b.capacity, "the capacity")
}

// MaxWait returns the longest wait it grants.
func (b *CostBucket) MaxWait() float64 { return b.maxWait }

// bucketHead is the length of the state's header: level, departure.
const bucketHead = 2

// level returns the bucket's level at t >= the newest departure.
func (b *CostBucket) level(st State, t float64) float64 {
	return math.Min(b.capacity, st[0]+(t-st[1])/b.interval)
}

// Delay returns how long after now the request departs: no earlier than
// the newest departure granted, and then when the bucket holds its cost.
func (b *CostBucket) Delay(st State, now float64, cost int64) float64 {
	if len(st) < bucketHead {
		return 0
	}
	base := math.Max(now, st[1])
	lvl := b.level(st, base)
	c := float64(cost)
	if lvl >= c {
		return base - now
	}
	return (base + float64((c-lvl)*b.interval)) - now
}

// stride is the length of a departure's record in the state.
const stride = 4

// ahead returns the index of the first departure still after now.
func ahead(st State, now float64) int {
	i := bucketHead
	for i+stride <= len(st) && st[i] <= now {
		i += stride
	}
	return i
}

// keepAhead drops the departures at or before now.
func keepAhead(st State, now float64) State {
	first := ahead(st, now)
	return st[:bucketHead+copy(st[bucketHead:], st[first:])]
}

// replay recomputes, from the level lvl at t, the levels before each
// departure from index i on and the level after the newest.
func (b *CostBucket) replay(st State, i int, lvl, t float64) State {
	for ; i+stride <= len(st); i += stride {
		st[i+2], st[i+3] = lvl, t
		lvl, t = math.Min(b.capacity, lvl+(st[i]-t)/b.interval)-st[i+1], st[i]
	}
	st[0], st[1] = lvl, t
	return st
}

// Commit takes the request's cost from the bucket at its departure,
// now+delay (an extra charged by a settle, at delay 0, is taken at the
// newest departure when that is later), and keeps the departure while it
// is ahead of now.
func (b *CostBucket) Commit(st State, now, delay float64, cost int64) State {
	at := now + delay
	c := float64(cost)
	if len(st) < bucketHead {
		st = append(st[:0], b.capacity-c, at)
		if at > now {
			st = append(st, at, c, b.capacity, at)
		}
		return st
	}
	at = math.Max(at, st[1])
	lvl, t := st[0], st[1]
	st = keepAhead(st, now)
	st[0], st[1] = math.Min(b.capacity, lvl+(at-t)/b.interval)-c, at
	if at > now {
		st = append(st, at, c, lvl, t)
	}
	return st
}

// GiveBack returns units (> 0) to the bucket for the reservation departing
// at at. One still ahead of now and cancelled whole is taken out of the
// schedule (the newest is undone: the next request is not held behind
// it). Otherwise (a call settled for less) the units come back into the
// bucket now. Either way the levels before the departures still ahead are
// recomputed, and the departures keep their instants.
func (b *CostBucket) GiveBack(st State, now, at float64, units int64) State {
	if len(st) < bucketHead || units <= 0 {
		return st
	}
	st = keepAhead(st, now)
	n := len(st)
	u := float64(units)
	if at > now {
		for i := n - stride; i >= bucketHead; i -= stride {
			if st[i] == at && st[i+1] == u { // cancelled before it left
				lvl, t := st[i+2], st[i+3]
				st = st[:i+copy(st[i:], st[i+stride:])]
				return b.replay(st, i, lvl, t)
			}
		}
	}
	if n == bucketHead { // nothing ahead: the bucket now, with the units back
		st[0], st[1] = math.Min(b.capacity, b.level(st, now)+u), now
		return st
	}
	// The units come back now, before every departure still ahead.
	lvl := math.Min(b.capacity, st[bucketHead+2]+(now-st[bucketHead+3])/b.interval)
	return b.replay(st, bucketHead, math.Min(b.capacity, lvl+u), now)
}

// Status returns the units the bucket holds at now (at the newest
// departure, when that is later) and the time until it is full again with
// no departure ahead.
func (b *CostBucket) Status(st State, now float64) (remaining, resetAfter float64) {
	if len(st) < bucketHead {
		return b.capacity, 0
	}
	base := math.Max(now, st[1])
	full := st[1] + float64((b.capacity-st[0])*b.interval)
	return math.Max(b.level(st, base), 0), math.Max(full-now, 0)
}

// Params returns "b": capacity, interval, longest wait.
func (b *CostBucket) Params() (string, [6]float64) {
	return "b", [6]float64{b.capacity, b.interval, b.maxWait}
}
