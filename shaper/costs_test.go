package shaper

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
)

// splitShaper is a partner's requests, input tokens and output tokens per
// minute, each with its whole quota as its burst, on a fake clock.
func splitShaper(t *testing.T) (*Shaper, *timer.Fake) {
	t.Helper()
	clock := timer.NewFake(t0)
	store := memstore.New(memstore.WithSweepInterval(0))
	t.Cleanup(func() { _ = store.Close() })
	s, err := All(store, []Dimension{
		{Name: "requests", Rate: PerMinute(50).WithBurst(50), Cost: func(int64) int64 { return 1 }},
		{Name: "input", Rate: PerMinute(1000).WithBurst(1000)},
		{Name: "output", Rate: PerMinute(200).WithBurst(200)},
	}, WithClock(clock), WithMaxQueue(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return s, clock
}

// remaining returns each dimension's units left for a request of one.
func remaining(t *testing.T, s *Shaper) map[string]int64 {
	t.Helper()
	st, err := s.Status(bg, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, d := range st.Dimensions {
		out[d.Name] = d.Remaining
	}
	return out
}

// Costs on the context charge each dimension it names its own cost, at the
// reservation and at the settle; the dimensions it leaves out take the
// cost argument (through their Cost), and a context without Costs charges
// every dimension the cost argument as before.
func TestCostsChargeEachDimensionItsOwn(t *testing.T) {
	s, _ := splitShaper(t)
	ctx := WithCosts(bg, Costs{"input": 300, "output": 150})
	r, err := s.Reserve(ctx, "k", 1)
	if err != nil || r.Delay != 0 {
		t.Fatalf("Reserve: %v, %v", r.Delay, err)
	}
	if got := remaining(t, s); got["requests"] != 49 || got["input"] != 700 || got["output"] != 50 {
		t.Fatalf("after 300 in, 150 out: %v, want requests 49, input 700, output 50", got)
	}
	// The call used 20 output tokens: the output dimension gets 130 back;
	// the input dimension, not named, settles at the actual argument (1).
	if err := r.Settle(WithCosts(bg, Costs{"output": 20}), 1); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, s); got["output"] != 180 || got["input"] != 999 || got["requests"] != 49 {
		t.Fatalf("after settling output at 20 and input at 1: %v, want output 180, input 999, requests 49", got)
	}
	// Without Costs, every dimension takes the cost argument.
	if _, err := s.Reserve(bg, "k", 100); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, s); got["output"] != 80 || got["input"] != 899 || got["requests"] != 48 {
		t.Fatalf("after a call of 100: %v, want output 80, input 899, requests 48", got)
	}
	// A cost of 0 leaves the dimension out.
	if _, err := s.Reserve(WithCosts(bg, Costs{"output": 0}), "k", 5); err != nil {
		t.Fatal(err)
	}
	if got := remaining(t, s); got["output"] != 80 || got["input"] != 894 {
		t.Fatalf("output left out: %v, want output 80, input 894", got)
	}
	// 110 more output tokens wait for the output dimension alone.
	r2, err := s.Reserve(WithCosts(bg, Costs{"input": 10, "output": 110}), "k", 1)
	if err != nil || r2.Delay != 9*time.Second {
		t.Fatalf("110 output tokens over 80 left: delay %v, %v; want 9s", r2.Delay, err)
	}
	if err := r2.Cancel(bg); err != nil {
		t.Fatal(err)
	}
}

// Costs that name no dimension of the shaper, or are negative, are refused
// as a *CostError before anything is written, at the reservation, the
// status and the settle (which may then be retried).
func TestCostsRefusesWhatItCannotCharge(t *testing.T) {
	s, _ := splitShaper(t)
	r, err := s.Reserve(WithCosts(bg, Costs{"output": 50}), "k", 10)
	if err != nil {
		t.Fatal(err)
	}
	before := remaining(t, s)
	for _, cs := range []Costs{{"outptu": 5}, {"output": -1}, {"input": 3, "nope": 1}} {
		ctx := WithCosts(bg, cs)
		_, err := s.Reserve(ctx, "k", 1)
		var ce *CostError
		if !errors.Is(err, ErrInvalidCost) || !errors.As(err, &ce) {
			t.Fatalf("Reserve with %v: %v, want a *CostError", cs, err)
		}
		if _, err := s.Status(ctx, "k", 1); !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("Status with %v: %v, want ErrInvalidCost", cs, err)
		}
		if err := s.Wait(ctx, "k", 1); !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("Wait with %v: %v, want ErrInvalidCost", cs, err)
		}
		if err := r.Settle(ctx, 5); !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("Settle with %v: %v, want ErrInvalidCost", cs, err)
		}
	}
	if got := remaining(t, s); got["output"] != before["output"] || got["input"] != before["input"] || got["requests"] != before["requests"] {
		t.Fatalf("refused costs wrote: %v, was %v", got, before)
	}
	if err := r.Settle(WithCosts(bg, Costs{"output": 0}), 10); err != nil { // the refused settles left it to settle
		t.Fatal(err)
	}
	if got := remaining(t, s); got["output"] != 200 {
		t.Fatalf("output settled at 0: %d left, want 200", got["output"])
	}
}

// A shaper of one dimension charges the cost argument, whatever Costs the
// context carries.
func TestCostsOnOneDimensionChargeTheCostArgument(t *testing.T) {
	s, _, _ := newTest(t, PerMinute(100).WithBurst(100))
	if _, err := s.Reserve(WithCosts(bg, Costs{"anything": 90}), "k", 7); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(bg, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if st.Remaining != 93 {
		t.Fatalf("remaining %d, want 93", st.Remaining)
	}
}
