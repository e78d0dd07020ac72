package shaper

import (
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
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
			s, err := All(memstore.New(memstore.WithSweepInterval(0)), []Dimension{
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
