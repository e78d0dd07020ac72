package shaper

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A reservation refunds at most once, only its own slot, and nothing once
// its time has passed, on the shaper of one contract and on a
// multi-dimension one. Cancelling a copy of a reservation a second time used
// to refund a newer caller's slot: after the first refund the next
// reservation stores the very TAT the cancelled one had. And a Cancel after
// the slot's time refunded it, though the caller may have departed
// (x/time/rate refunds nothing then: its TestCancelTooLate).
func TestAReservationRefundsOnceOnlyItsOwnSlot(t *testing.T) {
	t.Parallel()
	for name, mk := range map[string]func(t *testing.T) (*Shaper, interface{ Advance(time.Duration) }){
		"one contract": func(t *testing.T) (*Shaper, interface{ Advance(time.Duration) }) {
			s, _, clock := newTest(t, PerSecond(10))
			return s, clock
		},
		"two dimensions": func(t *testing.T) (*Shaper, interface{ Advance(time.Duration) }) {
			clock := newFakeAt(t0)
			s, err := All(NewMemoryStore(WithSweepInterval(0)), []Dimension{
				{Name: "requests", Rate: PerSecond(10)},
				{Name: "account", Rate: PerSecond(1000).WithBurst(1000), Key: func(string) string { return "acct" }},
			}, WithClock(clock))
			if err != nil {
				t.Fatal(err)
			}
			return s, clock
		},
	} {
		s, clock := mk(t)
		mustReserve(t, s, "k", 1)
		a := mustReserve(t, s, "k", 1) // slot +100ms, the tail
		copyOfA := a
		if err := a.Cancel(bg); err != nil {
			t.Fatal(err)
		}
		b := mustReserve(t, s, "k", 1) // takes a's slot: the same TAT a stored
		if b.Delay != 100*time.Millisecond {
			t.Fatalf("%s: after a's refund b waits %v, want a's 100ms slot", name, b.Delay)
		}
		if err := copyOfA.Cancel(bg); err != nil {
			t.Fatal(err)
		}
		if r := mustReserve(t, s, "k", 1); r.Delay != 200*time.Millisecond {
			t.Fatalf("%s: a copy of a cancelled again refunded b's slot: the next waits %v, want 200ms", name, r.Delay)
		}

		// Too late: the slot's time has passed.
		clock.Advance(time.Second)
		mustReserve(t, s, "late", 1)
		tail := mustReserve(t, s, "late", 1) // slot +100ms
		clock.Advance(150 * time.Millisecond)
		if err := tail.Cancel(bg); err != nil {
			t.Fatal(err)
		}
		if r := mustReserve(t, s, "late", 1); r.Delay != 50*time.Millisecond {
			t.Fatalf("%s: a Cancel after the slot's time refunded it: the next waits %v, want 50ms", name, r.Delay)
		}
	}
}

// The class of defect, as a property: random reserve / cancel sequences on
// one key, cancelling random reservations and random copies of them, some
// more than once, some after their time. Replaying the slots that were not
// refunded through the contract never finds two closer than the interval.
// A refund counts as taken back only if it was the reservation's first
// Cancel, made before its slot.
func TestCancelNeverGivesAwayAnotherSlot(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 11))
		s, _, clock := newTest(t, PerSecond(10), WithMaxQueue(time.Hour))
		now := t0
		type held struct {
			r        Reservation
			at       time.Time
			refunded bool
		}
		var all []*held
		for range 200 {
			switch op := rng.IntN(10); {
			case op < 5:
				r := mustReserve(t, s, "k", 1)
				all = append(all, &held{r: r, at: r.Time()})
			case op < 8 && len(all) > 0:
				h := all[rng.IntN(len(all))]
				c := h.r // a copy, as a caller passing it by value would hold
				before := mustPeekNext(t, s)
				_ = c.Cancel(bg)
				if after := mustPeekNext(t, s); after.Before(before) {
					if h.refunded || now.After(h.at) {
						t.Fatalf("seed %d: a second or late Cancel refunded", seed)
					}
					h.refunded = true
				}
			default:
				d := time.Duration(rng.IntN(120)) * time.Millisecond
				clock.Advance(d)
				now = now.Add(d)
			}
		}
		var slots []time.Time
		for _, h := range all {
			if !h.refunded {
				slots = append(slots, h.at)
			}
		}
		for i := range slots {
			for j := range i {
				if gap := slots[i].Sub(slots[j]).Abs(); gap < 100*time.Millisecond {
					t.Fatalf("seed %d: two slots kept are %v apart, interval 100ms", seed, gap)
				}
			}
		}
	}
}

// mustPeekNext returns when the next unit on "k" could depart, without
// consuming: a reservation cancelled at once (the tail, before its time).
func mustPeekNext(t *testing.T, s *Shaper) time.Time {
	t.Helper()
	r := mustReserve(t, s, "k", 1)
	at := r.Time()
	if err := r.Cancel(bg); err != nil {
		t.Fatal(err)
	}
	return at
}
