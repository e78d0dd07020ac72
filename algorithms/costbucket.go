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
// departures here only move forward in time, and what is given back is
// added to the level after the newest departure: every departure granted
// later sees it, none granted earlier counted on it. The only loss is the
// bucket's cap: units given back while departures are queued ahead are
// added only as far as none of those departures' levels would then pass
// the capacity (the partner's bucket would have spilled them).
//
// State layout: [level after the newest departure, the newest departure
// (ms), then one triple per departure still ahead of now at its commit:
// departure (ms), the level just before it, its cost]. A cold key is a
// full bucket.
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

// ahead returns the index of the first departure still after now.
func ahead(st State, now float64) int {
	i := bucketHead
	for i+2 < len(st) && st[i] <= now {
		i += 3
	}
	return i
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
			st = append(st, at, b.capacity, c)
		}
		return st
	}
	at = math.Max(at, st[1])
	pre := b.level(st, at)
	first := ahead(st, now)
	n := bucketHead + copy(st[bucketHead:], st[first:])
	st = st[:n]
	st[0], st[1] = pre-c, at
	if at > now {
		st = append(st, at, pre, c)
	}
	return st
}

// GiveBack returns units (> 0) to the bucket at now, for the reservation
// departing at at. The newest departure, still ahead and cancelled whole,
// is undone: the next request is not held behind it. Otherwise the units
// are added to the level after the newest departure, and to the level
// before each departure still ahead, as far as none of those passes the
// capacity.
func (b *CostBucket) GiveBack(st State, now, at float64, units int64) State {
	if len(st) < bucketHead || units <= 0 {
		return st
	}
	first := ahead(st, now)
	n := bucketHead + copy(st[bucketHead:], st[first:])
	st = st[:n]
	u := float64(units)
	if n >= bucketHead+3 && st[n-3] == at && st[1] == at && st[n-1] == u { // the newest, cancelled before it left
		pre := st[n-2]
		st = st[:n-3]
		if n -= 3; n >= bucketHead+3 { // the departure before it is ahead too: back to it
			st[0], st[1] = st[n-2]-st[n-1], st[n-3]
			return st
		}
		// None ahead: the level now was at least its level before the
		// cancelled departure less the refill since.
		st[0], st[1] = math.Min(b.capacity, pre-(at-now)/b.interval), now
		return st
	}
	if st[1] <= now { // nothing ahead: the bucket now, with the units back
		st[0], st[1] = math.Min(b.capacity, b.level(st, now)+u), now
		return st
	}
	peak := st[0]
	for i := bucketHead; i+2 < n; i += 3 {
		peak = math.Max(peak, st[i+1])
	}
	g := math.Min(u, b.capacity-peak)
	if g <= 0 {
		return st
	}
	st[0] += g
	for i := bucketHead; i+2 < n; i += 3 {
		st[i+1] += g
	}
	return st
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
