package shaper

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// slotOf returns r's departure instant.
func departs(r Reservation) time.Time { return r.Time() }

// mostInOneSecond returns the most slots in any window of one second,
// both ends included.
func mostInOneSecond(slots []time.Time) int {
	slots = slices.SortedFunc(slices.Values(slots), func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range slots {
		for slots[i].Sub(slots[j]) > time.Second {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// The switch, in one process (issue 26, item 4): with 2 s queued at 100/s
// burst 1, SetRate(20/s burst 50) let new requests depart ahead of the
// queue (20 of 20; busiest second 120). No slot granted after a change
// departs before one granted before it, the slots granted after it conform
// to the new contract, and where the burst does not shrink the busiest
// second stays within the more generous contract; on every store, rates up
// and down.
func TestALiveChangeNeverBurstsAtTheSwitch(t *testing.T) {
	t.Parallel()
	for kind, store := range liveStores(t) {
		for _, tc := range []struct {
			from, to Rate
			queued   int
		}{
			{PerSecond(100), PerSecond(20).WithBurst(50), 200},
			{PerSecond(20).WithBurst(50), PerSecond(100), 60},
			{PerSecond(10), PerSecond(100).WithBurst(5), 20},
		} {
			t.Run(fmt.Sprintf("%s/%v-to-%v", kind, tc.from, tc.to), func(t *testing.T) {
				clock := timer.NewFake(t0)
				s, err := New(store(), tc.from, WithClock(clock), WithMaxQueue(time.Minute), WithName(fmt.Sprintf("switch-%s-%v-%v", kind, tc.from.Count, tc.to.Count)))
				if err != nil {
					t.Fatal(err)
				}
				var before, after []time.Time
				for range tc.queued {
					before = append(before, departs(mustReserve(t, s, "k", 1)))
				}
				if err := s.SetRate(bg, "", tc.to); err != nil {
					t.Fatal(err)
				}
				for range 100 {
					after = append(after, departs(mustReserve(t, s, "k", 1)))
				}
				last := slices.MaxFunc(before, func(a, b time.Time) int { return a.Compare(b) })
				for i, at := range after {
					if at.Before(last) {
						t.Fatalf("slot %d after the change at +%v, ahead of the last slot granted before it (+%v)", i, at.Sub(t0), last.Sub(t0))
					}
				}
				// The slots granted under the new contract conform to it.
				var deps []edgeDep
				for _, at := range after {
					deps = append(deps, edgeDep{at: at.Sub(t0), cost: 1})
				}
				interval := time.Duration(float64(tc.to.Period) / float64(tc.to.Count))
				if i := edgeConforms(interval, interval*time.Duration(tc.to.burst()), deps); i >= 0 {
					t.Fatalf("slot %d granted after the change breaks the new contract", i)
				}
				// A burst the old contract left unspent builds up again at
				// the new rate, never at once: with bursts that do not
				// shrink, every second holds the more generous contract. (A
				// burst spent before a switch to a smaller burst and a
				// faster rate is not priced again: 50 at once at 20/s burst
				// 50, then 100/s from the last slot, give 110 in a second.)
				if tc.to.burst() >= tc.from.burst() {
					limit := int(max(tc.from.Count+tc.from.burst(), tc.to.Count+tc.to.burst()))
					if most := mostInOneSecond(append(before, after...)); most > limit {
						t.Fatalf("%d slots in one second across the switch, more than the more generous contract allows (%d)", most, limit)
					}
				}
			})
		}
	}
}

// The switch across a fleet (issue 26, item 3): shaper A changes 100/s
// burst 1 to 20/s burst 50 while shaper B, on the same prefix, has not
// followed yet (it never refreshes here) and queues 100; A then reserves
// 40. Each reads the shared schedule in its own contract, so together they
// never exceed the more generous contract (101 in any second: they gave
// 140), and A's slots come after B's; on a Redis node and the cluster.
func TestAFleetStaysWithinTheMoreGenerousContractWhileAChangePropagates(t *testing.T) {
	t.Parallel()
	node, cluster := nodeAndCluster(t)
	for kind, c := range map[string]redis.UniversalClient{"redis": node, "cluster": cluster} {
		t.Run(kind, func(t *testing.T) {
			clock := timer.NewFake(t0)
			shaper := func() *Shaper {
				s, err := New(redisstore.New(c, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine)), PerSecond(100), WithClock(clock),
					WithName("propagate-"+kind), WithContractRefresh(0), WithMaxQueue(time.Minute))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			a, b := shaper(), shaper()
			if err := a.SetRate(bg, "", PerSecond(20).WithBurst(50)); err != nil {
				t.Fatal(err)
			}
			if r, _ := b.Rate(""); r != PerSecond(100) {
				t.Fatalf("B follows at once (%v): the test needs it not to", r)
			}
			var slotsB, slotsA, later []time.Time
			for range 100 {
				slotsB = append(slotsB, departs(mustReserve(t, b, "k", 1)))
			}
			for range 40 {
				slotsA = append(slotsA, departs(mustReserve(t, a, "k", 1)))
			}
			for range 20 { // B again, after A's slots
				later = append(later, departs(mustReserve(t, b, "k", 1)))
			}
			lastB := slices.MaxFunc(slotsB, func(x, y time.Time) int { return x.Compare(y) })
			for i, at := range slotsA {
				if at.Before(lastB) {
					t.Fatalf("A's slot %d at +%v, ahead of B's last (+%v)", i, at.Sub(t0), lastB.Sub(t0))
				}
			}
			lastA := slices.MaxFunc(slotsA, func(x, y time.Time) int { return x.Compare(y) })
			for i, at := range later {
				if at.Before(lastA) {
					t.Fatalf("B's later slot %d at +%v, ahead of A's last (+%v)", i, at.Sub(t0), lastA.Sub(t0))
				}
			}
			all := slices.Concat(slotsB, slotsA, later)
			if most := mostInOneSecond(all); most > 101 {
				t.Fatalf("%d slots in one second while the change propagated: more than the more generous contract (100/s burst 1: 101)", most)
			}
		})
	}
}

// A spacing margin is computed from the contract in force fleet-wide, not
// from one this process has not followed yet: B, which reads the record
// hourly, spaces a strict key after A changed the contract to 25/s by
// 25/s's interval plus its margin (44 ms), not by the 26/s it still held
// (42.3 ms).
func TestSpaceReadsTheContractInForce(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	clock := timer.NewFake(t0)
	shaper := func() *Shaper {
		s, err := New(redisstore.New(node, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine)), PerSecond(26), WithClock(clock),
			WithName("feedback-fresh"), WithContractRefresh(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := shaper(), shaper()
	if err := a.SetRate(bg, "", PerSecond(25)); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.Rate(""); r != PerSecond(26) {
		t.Fatalf("B follows at once (%v): the test needs it not to", r)
	}
	if err := b.Space(bg, "k", 4*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if r, _ := b.Rate(""); r != PerSecond(25) {
		t.Fatalf("B still holds %v after a partner's feedback", r)
	}
	first, second := mustReserve(t, a, "k", 1), mustReserve(t, a, "k", 1)
	if gap := second.Time().Sub(first.Time()); gap != 44*time.Millisecond {
		t.Fatalf("a strict 25/s key spaced with a 4 ms margin: departures %v apart, want 44ms", gap)
	}
}
