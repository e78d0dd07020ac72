// Package storetest is the cross-store conformance suite, driven through
// package shaper's public API: shaper configurations (Scenarios), seeded
// runs of each that record every outcome in a transcript (Scenario.Run,
// Scenario.Edge), the comparison of two transcripts (Same), and the suites
// a store package's tests call on its store (Conformance, Edges,
// StatusConsumesNothing): every store must give the memory store's
// transcript, step by step.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// T0 is the instant the suite's fake clocks start at.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var bg = context.Background()

// Scenario is one shaper configuration of the cross-store conformance run:
// a shaper of one contract (Rate, Dims nil) or All (Any) of Dims.
type Scenario struct {
	Name string
	Alg  shaper.Algorithm // the zero Algorithm: the default (LeakyBucket)
	Rate shaper.Rate      // a shaper of one contract: its rate
	Dims []shaper.Dimension
	Any  bool
	Opts []shaper.Option // besides WithClock, WithAlgorithm and WithPrefix
}

// New makes sc's shaper on store, on clock, with its keys under prefix.
func (sc Scenario) New(store shaper.Store, clock shaper.Clock, prefix string) (*shaper.Shaper, error) {
	opts := []shaper.Option{shaper.WithClock(clock)}
	if sc.defaultAlg() {
		opts = append(opts, shaper.WithPrefix(prefix))
	} else {
		opts = append(opts, shaper.WithAlgorithm(sc.Alg), shaper.WithPrefix(prefix))
	}
	opts = append(opts, sc.Opts...)
	switch {
	case sc.Dims == nil:
		return shaper.New(store, sc.Rate, opts...)
	case sc.Any:
		return shaper.Any(store, sc.Dims, opts...)
	}
	return shaper.All(store, sc.Dims, opts...)
}

// must is sc.New, failing t on an error.
func (sc Scenario) must(t testing.TB, store shaper.Store, clock shaper.Clock, prefix string) *shaper.Shaper {
	t.Helper()
	s, err := sc.New(store, clock, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (sc Scenario) defaultAlg() bool { return sc.Alg.String() == shaper.Algorithm{}.String() }

// alg is the algorithm sc's dimensions run.
func (sc Scenario) alg() shaper.Algorithm {
	if sc.defaultAlg() {
		return shaper.LeakyBucket
	}
	return sc.Alg
}

// dimensions returns sc's dimensions: one, unnamed, for a shaper of one
// contract.
func (sc Scenario) dimensions() []shaper.Dimension {
	if sc.Dims == nil {
		return []shaper.Dimension{{Rate: sc.Rate}}
	}
	return sc.Dims
}

// Scenarios returns the configurations of the conformance run: every
// algorithm, a multi-dimension shaper and two Any shapers.
func Scenarios() []Scenario {
	account := func(key string) string { return "acct:" + key[:min(1, len(key))] }
	return []Scenario{
		{Name: "leaky 7/3s", Alg: shaper.LeakyBucket, Rate: shaper.Rate{Count: 7, Period: 3 * time.Second}, Opts: []shaper.Option{shaper.WithMaxQueue(5 * time.Second)}},
		{Name: "leaky 10/s burst 3", Alg: shaper.LeakyBucket, Rate: shaper.PerSecond(10).WithBurst(3), Opts: []shaper.Option{shaper.WithMaxQueue(2 * time.Second)}},
		{Name: "gcra", Alg: shaper.GCRA, Rate: shaper.PerSecond(5).WithBurst(5)},
		{Name: "token", Alg: shaper.TokenBucket, Rate: shaper.PerSecond(4).WithBurst(6)},
		{Name: "fixed", Alg: shaper.FixedWindow, Rate: shaper.PerSecond(6)},
		{Name: "sliding", Alg: shaper.SlidingWindow, Rate: shaper.Rate{Count: 9, Period: 2 * time.Second}},
		{Name: "log", Alg: shaper.SlidingWindowLog, Rate: shaper.PerSecond(5)},
		{Name: "quota", Alg: shaper.Quota(shaper.Daily(14 * time.Hour)), Rate: shaper.PerSecond(30)},
		{Name: "multi", Dims: []shaper.Dimension{
			{Name: "account", Rate: shaper.PerSecond(8), Key: account, Cost: func(int64) int64 { return 1 }},
			{Name: "tokens", Rate: shaper.PerSecond(100).WithBurst(40)},
		}, Opts: []shaper.Option{shaper.WithMaxQueue(3 * time.Second)}},
		{Name: "any", Any: true, Dims: []shaper.Dimension{
			{Name: "own", Rate: shaper.PerSecond(3).WithBurst(2)},
			{Name: "pool", Rate: shaper.PerSecond(4).WithBurst(3), Key: account, Slot: true},
			{Name: "tokens", Rate: shaper.PerSecond(20).WithBurst(4), Cost: func(c int64) int64 { return 2 * c }},
		}, Opts: []shaper.Option{shaper.WithMaxQueue(2 * time.Second)}},
		{Name: "any gcra", Alg: shaper.GCRA, Any: true, Dims: []shaper.Dimension{
			{Name: "own", Rate: shaper.PerSecond(2).WithBurst(2)},
			{Name: "pool", Rate: shaper.PerSecond(5).WithBurst(2), Key: account},
		}},
	}
}

// OddKeys are the keys of Run: braces, spaces, backslashes and non-ASCII.
var OddKeys = []string{"a", "b{x}", "c}", "{d", "e f", "ключ", `g\h`, "a"}

// Run drives s, made from sc, through a seeded sequence of operations on
// OddKeys, each reservation preceded by a Status (see RunKeys), and returns
// the transcript of every outcome. after, if not nil, runs after every
// operation.
func (sc Scenario) Run(t *testing.T, s *shaper.Shaper, clock *timer.Fake, seed uint64, after func()) []string {
	t.Helper()
	return sc.RunKeys(t, s, clock, seed, OddKeys, after, true)
}

// RunKeys is Run over the given keys. With probe, every reservation is
// preceded by a Status of its key and cost, whose figures join the
// transcript (as lines starting "status") and must predict the reservation;
// the other lines do not depend on probe.
func (sc Scenario) RunKeys(t *testing.T, s *shaper.Shaper, clock *timer.Fake, seed uint64, keys []string, after func(), probe bool) []string {
	t.Helper()
	rn := &runner{t: t, sc: sc, s: s, clock: clock, clamps: map[string]float64{}}
	rng := rand.New(rand.NewPCG(seed, 3))
	var out []string
	var held []shaper.Reservation
	for i := range 300 {
		key := keys[rng.IntN(len(keys))]
		switch op := rng.IntN(21); {
		case op < 10:
			cost := int64(1 + rng.IntN(3))
			var st shaper.Status
			var stErr error
			if probe {
				st, stErr = rn.probeStatus(key, cost)
				out = append(out, fmt.Sprintf("status %d %q: %s %v", i, key, statusText(st, clock.Now()), ErrText(stErr)))
			}
			r, err := s.Reserve(bg, key, cost)
			if err == nil {
				held = append(held, r)
			}
			if probe {
				rn.checkStatus(key, cost, st, stErr, r, err)
				out = append(out, fmt.Sprintf("status %d remaining %d", i, r.Remaining()))
			}
			out = append(out, fmt.Sprintf("%d reserve %q: %v %v", i, key, r.Delay, ErrText(err)))
		case op < 13:
			ok, err := s.Allow(bg, key, 1)
			out = append(out, fmt.Sprintf("%d allow %q: %v %v", i, key, ok, ErrText(err)))
		case op < 15 && len(held) > 0:
			j := rng.IntN(len(held))
			err := held[j].Cancel(bg)
			out = append(out, fmt.Sprintf("%d cancel %d: %v", i, j, ErrText(err)))
		case op < 16:
			err := s.Pause(bg, key, time.Duration(rng.IntN(1500))*time.Millisecond)
			out = append(out, fmt.Sprintf("%d pause %q: %v", i, key, ErrText(err)))
		case op < 17:
			n, reset := int64(rng.IntN(6)), time.Duration(rng.IntN(3000))*time.Millisecond
			now := clock.Now()
			err := s.Clamp(bg, key, n, reset)
			if err == nil {
				rn.clamped(key, n, reset, now)
			}
			out = append(out, fmt.Sprintf("%d clamp %q %d in %v: %v", i, key, n, reset, ErrText(err)))
		case op < 18:
			err := s.Reset(bg, key)
			if err == nil {
				delete(rn.clamps, key)
			}
			out = append(out, fmt.Sprintf("%d reset %q: %v", i, key, ErrText(err)))
		default:
			clock.Advance(time.Duration(rng.IntN(700)) * time.Millisecond)
		}
		if after != nil {
			after()
		}
	}
	return out
}

// runner is one run of a scenario: what its checks of Status need.
type runner struct {
	t      *testing.T
	sc     Scenario
	s      *shaper.Shaper
	clock  *timer.Fake
	clamps map[string]float64 // key -> the end (ms) of the partner's clamp Clamp set on it
}

// clamped records the clamp that Clamp(key, remaining, reset), returning
// nil at now, set, by Shaper.Clamp's rule: reset <= 0 sets nothing,
// remaining <= 0 pauses instead, and a remaining count the contract could
// not exceed before the reset anyway (every dimension's Burst + Count per
// Period over reset) records nothing; otherwise the clamp replaces any
// earlier one and holds until now + reset.
func (rn *runner) clamped(key string, remaining int64, reset time.Duration, now time.Time) {
	if reset <= 0 || remaining <= 0 {
		return
	}
	least := math.Inf(1)
	for _, d := range rn.sc.dimensions() {
		r, ok := rn.s.Rate(d.Name)
		if !ok {
			rn.t.Fatalf("the shaper has no dimension %q", d.Name)
		}
		burst := r.Burst
		if burst == 0 {
			burst = 1
		}
		least = min(least, float64(burst)+float64(r.Count)*reset.Seconds()/r.Period.Seconds())
	}
	if float64(remaining) >= least {
		return
	}
	rn.clamps[key] = algorithms.Millis(now) + algorithms.DurationMillis(reset)
}

// clampHolds reports whether a partner's clamp holds key at the clock's
// now (a shaper of one contract: its key is the caller's).
func (rn *runner) clampHolds(key string) bool {
	end, ok := rn.clamps[key]
	return ok && algorithms.Millis(rn.clock.Now()) < end
}

// statusText renders st with instants relative to now.
func statusText(st shaper.Status, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rem %d next +%v reset +%v binding %q", st.Remaining, st.Next.Sub(now), st.ResetAt.Sub(now), st.Binding)
	for _, d := range st.Dimensions {
		fmt.Fprintf(&b, " [%s %s rem %d next +%v reset +%v]", d.Name, d.Key, d.Remaining, d.Next.Sub(now), d.ResetAt.Sub(now))
	}
	return b.String()
}

// probeStatus reads key's status for cost and checks what Status alone
// must satisfy: no instant before now (a cost above the burst may depart
// after the key is cold: ResetAt can come before Next), the binding
// dimension's figures on top, ResetAt the latest, and, for a shaper of one
// contract, Remaining exact (Remaining units depart at once, one more does
// not).
func (rn *runner) probeStatus(key string, cost int64) (shaper.Status, error) {
	t, s := rn.t, rn.s
	t.Helper()
	now := rn.clock.Now()
	st, err := s.Status(bg, key, cost)
	if err != nil {
		if !errors.Is(err, shaper.ErrInvalidCost) {
			t.Fatalf("Status(%q, %d): %v", key, cost, err)
		}
		return st, err
	}
	if st.Next.Before(now) || st.ResetAt.Before(now) || st.ResetAt.Before(st.PausedUntil) ||
		st.Binding == "pause" && (!st.Next.Equal(st.PausedUntil) || !st.Next.After(now)) {
		t.Fatalf("Status(%q, %d) at %v: %s", key, cost, now, statusText(st, now))
	}
	dims := len(rn.sc.dimensions())
	if len(st.Dimensions) != dims {
		t.Fatalf("Status has %d dimensions, the shaper %d", len(st.Dimensions), dims)
	}
	for _, d := range st.Dimensions {
		if d.ResetAt.After(st.ResetAt) {
			t.Fatalf("dimension %s is cold at %v, after the key's ResetAt %v", d.Name, d.ResetAt, st.ResetAt)
		}
	}
	if st.Binding != "pause" {
		found := false
		for _, d := range st.Dimensions {
			if d.Name == st.Binding {
				found = d.Next.Equal(st.Next) && (d.Remaining == st.Remaining || st.Remaining == 0 && st.PausedUntil.After(now))
			}
		}
		if !found {
			t.Fatalf("the binding dimension %q does not carry the key's figures: %s", st.Binding, statusText(st, now))
		}
	}
	if dims == 1 && st.Binding == "" && st.Remaining > 0 && st.Remaining <= 1<<20 {
		at, err := s.Status(bg, key, st.Remaining)
		if err == nil && !at.Next.Equal(now) {
			t.Fatalf("%s: Status says %d remain, but a request of %d departs at +%v", rn.sc.alg(), st.Remaining, st.Remaining, at.Next.Sub(now))
		}
		// Under a partner's clamp one request departs per slot, whatever
		// its cost: Remaining counts requests of one unit (at most 1), and
		// a larger one still departs at once.
		more, err := s.Status(bg, key, st.Remaining+1)
		if err == nil && !more.Next.After(now) && !rn.clampHolds(key) {
			t.Fatalf("Status says %d remain, but a request of %d departs at once", st.Remaining, st.Remaining+1)
		}
	}
	return st, nil
}

// checkStatus checks that st, read just before r was reserved at the same
// instant for key and cost, predicted it: a grant departs no later than
// Next (earlier only by a hole a cancelled slot left), a refusal means Next
// lies past MaxQueue (at once for the algorithms that never queue), and r's
// Remaining is what a Status would read now.
func (rn *runner) checkStatus(key string, cost int64, st shaper.Status, stErr error, r shaper.Reservation, err error) {
	t, s := rn.t, rn.s
	t.Helper()
	if stErr != nil { // a cost Status refused, Reserve refuses alike
		if !errors.Is(err, shaper.ErrInvalidCost) {
			t.Fatalf("Status refused the cost (%v), Reserve answered %v", stErr, err)
		}
		return
	}
	now := rn.clock.Now()
	wait := st.Next.Sub(now)
	limit := time.Duration(0)
	if rn.sc.alg() == shaper.LeakyBucket { // Reserve grants delays
		limit = s.MaxQueue()
	}
	switch {
	case err == nil && r.Delay > wait:
		t.Fatalf("Status said +%v, the reservation departs at +%v", wait, r.Delay)
	case err == nil && wait > limit && r.Delay == wait:
		t.Fatalf("Status said +%v (past MaxQueue %v), yet the reservation was granted at that wait", wait, limit)
	case errors.Is(err, shaper.ErrQueueFull) && wait <= limit:
		t.Fatalf("Status said +%v (within MaxQueue %v), yet the reservation was refused: %v", wait, limit, err)
	}
	if err != nil || len(rn.sc.dimensions()) != 1 {
		return
	}
	after, err := s.Status(bg, key, cost)
	if err != nil {
		t.Fatal(err)
	}
	if after.Binding != "pause" && after.Dimensions[0].Remaining != r.Remaining() {
		t.Fatalf("the reservation reports %d remaining, Status right after it %d", r.Remaining(), after.Dimensions[0].Remaining)
	}
}

// Same fails t at the first step where got differs from want, the
// transcript of the reference (ref), or when their lengths differ.
func Same(t *testing.T, what, ref string, want, got []string) {
	t.Helper()
	for j := range min(len(want), len(got)) {
		if got[j] != want[j] {
			t.Fatalf("%s: step %d\n %s: %s\n      got: %s", what, j, ref, want[j], got[j])
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%s: %d steps, %s %d", what, len(got), ref, len(want))
	}
}

// ErrText is err in a transcript: "ok" for nil, a *QueueFullError's
// figures, any other error's text.
func ErrText(err error) string {
	if err == nil {
		return "ok"
	}
	var qf *shaper.QueueFullError
	if errors.As(err, &qf) {
		return fmt.Sprintf("queue-full(%v, %v, %s)", qf.Delay, qf.MaxQueue, qf.Dimension)
	}
	return err.Error()
}

// CollidingKeys are keys built to collide under a careless encoding: the
// pause suffix, the separators, braces that would choose a slot, escapes,
// and the empty key (an empty hash tag is ignored by Redis Cluster).
var CollidingKeys = []string{"x", "x:p", `x\;p`, ":p", "p", "", "{", "}", "{x}", `\(x\)`, "a:b", `a\:b`, "x\\"}

// Edge drives s, made from sc, through edge inputs and returns the
// transcript: every cost from 1 to the largest admissible + 2 (or its
// neighbourhood when that is large), first on a cold key, then on the same
// key again (now at or past its MaxQueue boundary), then with Allow; and
// one reservation on each of CollidingKeys, which must all behave as
// distinct cold keys. The largest admissible cost is the least, over the
// dimensions whose cost is not mapped, of what a shaper of that dimension
// alone accepts (MaxCost).
func (sc Scenario) Edge(t *testing.T, s *shaper.Shaper, clock interface{ Advance(time.Duration) }) []string {
	t.Helper()
	maxCost := int64(1 << 53)
	for _, d := range sc.dimensions() {
		if d.Cost == nil {
			alone, err := shaper.New(memstore.New(memstore.WithSweepInterval(0)), d.Rate, shaper.WithAlgorithm(sc.alg()), shaper.WithMaxQueue(s.MaxQueue()))
			if err != nil {
				t.Fatal(err)
			}
			maxCost = min(maxCost, MaxCost(t, alone))
		}
	}
	var costs []int64
	for c := int64(1); c <= min(maxCost+2, 24); c++ {
		costs = append(costs, c)
	}
	for c := max(maxCost-2, 25); c <= maxCost+2; c++ {
		costs = append(costs, c)
	}
	var out []string
	for _, c := range costs {
		key := fmt.Sprintf("cost%d", c)
		for try := range 2 {
			r, err := s.Reserve(bg, key, c)
			out = append(out, fmt.Sprintf("reserve %s #%d (max %d): %v %v", key, try, maxCost, r.Delay, ErrText(err)))
		}
		ok, err := s.Allow(bg, "allow"+key, c)
		out = append(out, fmt.Sprintf("allow %d: %v %v", c, ok, ErrText(err)))
		clock.Advance(7 * time.Millisecond)
	}
	for _, key := range CollidingKeys {
		r, err := s.Reserve(bg, key, 1)
		out = append(out, fmt.Sprintf("reserve %q: %v %v", key, r.Delay, ErrText(err)))
	}
	return out
}

// MaxCost returns the largest cost s, a shaper of one contract, accepts:
// algorithms.MaxCost of its algorithm, found by the same search over
// Status, which checks a cost as Reserve does and consumes nothing.
func MaxCost(t testing.TB, s *shaper.Shaper) int64 {
	t.Helper()
	ok := func(c int64) bool {
		if c < 1 {
			return false
		}
		_, err := s.Status(bg, "storetest-maxcost", c)
		if err != nil && !errors.Is(err, shaper.ErrInvalidCost) {
			t.Fatalf("Status of cost %d: %v", c, err)
		}
		return err == nil
	}
	lo, hi := int64(0), int64(1<<53)
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// Candidate is a store under test: New makes a fresh one (for each
// scenario); Name names it in a failure.
type Candidate struct {
	Name string
	New  func() shaper.Store
}

// memory is the reference store: no background sweeper.
func memory() shaper.Store { return memstore.New(memstore.WithSweepInterval(0)) }

// Conformance runs every scenario (Run) on c's store and on a memory
// store, on a fake clock each, and fails t at the first step where they
// differ: same delays, same refusals, same errors and the same Status
// figures, on keys with braces, spaces, backslashes and non-ASCII. The
// keys of scenario i are under the prefix "conf<i>-<c.Name>:".
func Conformance(t *testing.T, c Candidate) {
	t.Helper()
	for i, sc := range Scenarios() {
		memClock, clock := timer.NewFake(T0), timer.NewFake(T0)
		prefix := fmt.Sprintf("conf%d-%s:", i, c.Name) // scenarios must not share keys on one server
		ms := sc.must(t, memory(), memClock, prefix)
		s := sc.must(t, c.New(), clock, prefix)
		want := sc.Run(t, ms, memClock, uint64(i), nil)
		got := sc.Run(t, s, clock, uint64(i), nil)
		Same(t, sc.Name, "memory", want, got)
	}
}

// Edges runs every scenario's edge inputs (Edge) on each store and on a
// memory store, and fails t at the first step where they differ: costs at
// and past every algorithm's admissibility boundary, keys at the MaxQueue
// boundary, and keys built to collide.
func Edges(t *testing.T, stores ...Candidate) {
	t.Helper()
	for i, sc := range Scenarios() {
		prefix := fmt.Sprintf("edge%d:", i)
		memClock := timer.NewFake(T0)
		want := sc.Edge(t, sc.must(t, memory(), memClock, prefix), memClock)
		for _, c := range stores {
			clock := timer.NewFake(T0)
			got := sc.Edge(t, sc.must(t, c.New(), clock, prefix), clock)
			Same(t, fmt.Sprintf("%s on %s", sc.Name, c.Name), "memory", want, got)
		}
	}
}

// StatusConsumesNothing runs every scenario on c's store with a Status
// before each reservation (and its checks) and without, and fails t at the
// first step where the outcomes differ. The keys are under the prefix
// "nothing<i><probe>:".
func StatusConsumesNothing(t *testing.T, c Candidate) {
	t.Helper()
	for i, sc := range Scenarios() {
		run := func(probe bool) []string {
			clock := timer.NewFake(T0)
			s := sc.must(t, c.New(), clock, fmt.Sprintf("nothing%d%v:", i, probe))
			var out []string
			for _, line := range sc.RunKeys(t, s, clock, uint64(i), OddKeys, nil, probe) {
				if !strings.HasPrefix(line, "status") {
					out = append(out, line)
				}
			}
			return out
		}
		without, with := run(false), run(true)
		Same(t, fmt.Sprintf("%s, %s, with a Status before each reservation", c.Name, sc.Name), "without", without, with)
	}
}
