package algorithms

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// partnerEvent is what a partner's token bucket sees: an arrival that
// takes units (refused when the bucket holds fewer), or units coming back
// when a call completes having used less than it took.
type partnerEvent struct {
	at     float64
	units  float64
	refund bool
}

// overdraws replays events on a token bucket of capacity refilled at one
// unit per interval ms, full at the first event, events at the same instant in
// the order they happened, and returns the first arrival it would refuse (-1: none).
func overdraws(events []partnerEvent, capacity, interval float64) int {
	slices.SortStableFunc(events, func(a, b partnerEvent) int { return cmp.Compare(a.at, b.at) })
	tokens, last := capacity, math.Inf(-1)
	for i, e := range events {
		if !math.IsInf(last, -1) {
			tokens = math.Min(capacity, tokens+(e.at-last)/interval)
		}
		last = e.at
		if e.refund {
			tokens = math.Min(capacity, tokens+e.units)
			continue
		}
		if tokens+1e-3/interval < e.units {
			return i
		}
		tokens -= e.units
	}
	return -1
}

// checkCostBucket plays one seeded run: reservations of random costs on a
// random bucket, the departed ones settled later for less (the partner's
// refund at the settle, the latest it can be), queued ones cancelled (the
// newest or any), and the clock moving on in steps short and long. The
// partner's own bucket, fed the departures, never refuses one, and the
// departures never go back in time.
func checkCostBucket(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 21))
	capacity := float64(1 + rng.IntN(500))
	count := int64(1 + rng.IntN(100))
	period := time.Duration(1+rng.IntN(5000)) * time.Millisecond
	b := must(NewCostBucket(capacity, count, period, 10000*time.Hour))
	type held struct {
		at   float64
		cost int64
	}
	var st State
	var queued, departed []held
	var events []partnerEvent
	now, last := 1.7e12, math.Inf(-1)
	for step := range 500 {
		switch x := rng.IntN(10); {
		case x < 5:
			cost := int64(1 + rng.IntN(int(capacity)))
			if rng.IntN(3) == 0 {
				cost = 1
			}
			var dec Decision
			var err error
			st, dec, err = Reserve(b, st, now, cost)
			if err != nil || !dec.Allowed {
				t.Fatalf("seed %d step %d: cost %d refused (%v) with a queue of 10,000 hours", seed, step, cost, err)
			}
			at := now + dec.Wait()
			if at < last {
				t.Fatalf("seed %d step %d: departure %v before one granted before it, %v", seed, step, at, last)
			}
			last = at
			queued = append(queued, held{at, cost})
		case x < 7 && len(departed) > 0: // settled for less, at now
			i := rng.IntN(len(departed))
			h := departed[i]
			departed = slices.Delete(departed, i, i+1)
			back := int64(rng.IntN(int(h.cost) + 1))
			st = b.GiveBack(st, now, h.at, back)
			events = append(events, partnerEvent{now, float64(back), true})
		case x < 8 && len(queued) > 0: // cancelled before its slot: the partner never sees it
			i := len(queued) - 1
			if rng.IntN(2) == 0 {
				i = rng.IntN(len(queued))
			}
			h := queued[i]
			queued = slices.Delete(queued, i, i+1)
			st = b.GiveBack(st, now, h.at, h.cost)
			if i == len(queued) { // the newest: the next request is not held behind it
				last = math.Inf(-1)
				for _, q := range queued {
					last = math.Max(last, q.at)
				}
				for _, d := range departed {
					last = math.Max(last, d.at)
				}
			}
		default:
			step := float64(rng.IntN(int(period.Milliseconds())/4 + 2))
			if rng.IntN(20) == 0 {
				step *= 50
			}
			now += step
		}
		// Those whose slots have come depart: the partner sees them.
		kept := queued[:0]
		for _, q := range queued {
			if q.at <= now {
				departed = append(departed, q)
				events = append(events, partnerEvent{q.at, float64(q.cost), false})
				continue
			}
			kept = append(kept, q)
		}
		queued = kept
	}
	for _, q := range queued {
		events = append(events, partnerEvent{q.at, float64(q.cost), false})
	}
	if i := overdraws(events, capacity, b.interval); i >= 0 {
		t.Fatalf("seed %d: the partner's bucket refuses the arrival at %v of %v (capacity %v, %d per %v)", seed, events[i].at, events[i].units, capacity, count, period)
	}
}

func TestCostBucketNeverOverdrawsThePartnersBucket(t *testing.T) {
	for seed := range uint64(300) {
		checkCostBucket(t, seed)
	}
}

func FuzzCostBucketNeverOverdraws(f *testing.F) {
	for seed := range uint64(8) {
		f.Add(seed)
	}
	f.Fuzz(checkCostBucket)
}

// What a call did not use comes back to the departures granted after its
// settle, as far as the bucket's capacity allows, and a queued request
// cancelled whole holds nothing: the exact schedule of a bucket of 10
// refilled at 10/s.
func TestCostBucketSettleAndCancel(t *testing.T) {
	b := must(NewCostBucket(10, 10, time.Second, time.Hour))
	now := 1.7e12
	reserve := func(st State, cost int64) (State, float64) {
		st, dec, err := Reserve(b, st, now, cost)
		if err != nil || !dec.Allowed {
			t.Fatalf("cost %d: %v %+v", cost, err, dec)
		}
		return st, dec.Wait()
	}
	st, w := reserve(nil, 10)
	if w != 0 {
		t.Fatalf("a full bucket: wait %v", w)
	}
	st, w = reserve(st, 5)
	if w != 500 {
		t.Fatalf("5 more: wait %v, want 500 ms", w)
	}
	// The first used 2: 8 come back at once, but the bucket would be full
	// before the queued departure, so only 5 count for it and after it.
	st = b.GiveBack(st, now, now, 8)
	if st, w = reserve(st, 5); w != 500 {
		t.Fatalf("after the settle, 5 more: wait %v, want 500 ms (with the 5 of 8 the bucket keeps)", w)
	}
	// A queued request cancelled whole: the next one waits as if it never was.
	probe := b.Delay(st, now, 7)
	var at float64
	st, at = reserve(st, 6)
	st = b.GiveBack(st, now, now+at, 6)
	if got := b.Delay(st, now, 7); got != probe {
		t.Fatalf("after a cancel, 7 wait %v ms, %v before", got, probe)
	}
	// Nothing queued: a settle fills the bucket now, up to its capacity.
	now += 10000
	st, _ = reserve(st, 10)
	st = b.GiveBack(st, now+1, now, 4)
	if rem, _ := b.Status(st, now+1); rem != 4.01 {
		t.Fatalf("remaining %v, want 4.01 (4 given back, 0.01 refilled)", rem)
	}
}

// Reservations queued on a drained bucket and then cancelled, in any
// order, hold nothing: the next request waits as it would have without
// them, and the bucket is left as it was (a fleet's horizon gates cancel
// slots granted too far ahead, interleaved with the others' reservations;
// a cancelled slot that stayed in the schedule ran a fleet's queue away
// by seconds within seconds).
func TestCostBucketCancelsHoldNothing(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 9))
		capacity := float64(50 + rng.IntN(500))
		b := must(NewCostBucket(capacity, int64(1+rng.IntN(100)), time.Duration(100+rng.IntN(5000))*time.Millisecond, 10000*time.Hour))
		now := 1.7e12
		st, _, _ := Reserve(b, nil, now, int64(capacity)) // drained: no level reaches the capacity while these queue
		for range rng.IntN(5) {
			now += float64(rng.IntN(50))
			st, _, _ = Reserve(b, st, now, int64(1+rng.IntN(int(capacity)/2)))
		}
		probe := int64(1 + rng.IntN(int(capacity)))
		want := b.Delay(st, now, probe)
		wantRem, _ := b.Status(st, now)
		st, held := reserveThenCancel(b, st, now, int(capacity), rng)
		if got := b.Delay(st, now, probe); math.Abs(got-want) > 1e-6 {
			t.Fatalf("seed %d: a request of %d waits %v ms after %d cancelled reservations, %v before them", seed, probe, got, held, want)
		}
		if rem, _ := b.Status(st, now); math.Abs(rem-wantRem) > 1e-6 {
			t.Fatalf("seed %d: %v units left after the cancels, %v before", seed, rem, wantRem)
		}
	}
}
