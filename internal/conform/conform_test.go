package conform

import "testing"

// Check judges each departure with the overruns settled before its grant:
// a slot granted before an overrun keeps its time, one granted after must
// make room for it.
func TestCheckJudgesEachDepartureWithTheOverrunsKnownAtItsGrant(t *testing.T) {
	// T 100 ms, burst 1: slots at 0, 100 and 200; the one at 100 settled
	// at 2 units (step 4).
	deps := func(third Departure) []Departure {
		return []Departure{{At: 0, Cost: 1, Granted: 1}, {At: 100, Cost: 2, Reserved: 1, Granted: 2, Settled: 4}, third}
	}
	if d, ok := Check(100, 100, deps(Departure{At: 200, Cost: 1, Granted: 3})); !ok {
		t.Errorf("slots granted before the overrun keep their times; %+v fails", d)
	}
	if d, ok := Check(100, 100, deps(Departure{At: 200, Cost: 1, Granted: 5})); ok || d.At != 200 {
		t.Errorf("a slot granted after the overrun without room for it: %+v, %v; want the one at 200 refused", d, ok)
	}
	if d, ok := Check(100, 100, deps(Departure{At: 300, Cost: 1, Granted: 5})); !ok {
		t.Errorf("a slot granted after the overrun that makes room for it: %+v fails", d)
	}
	// Without overruns every departure counts at its cost.
	if d, ok := Check(100, 100, []Departure{{At: 0, Cost: 1}, {At: 50, Cost: 1}}); ok || d.At != 50 {
		t.Errorf("two within 100 ms on burst 1: %+v, %v", d, ok)
	}
}
