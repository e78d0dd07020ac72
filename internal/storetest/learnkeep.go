package storetest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/learn"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// Departure is one request a simulated fleet let go: its slot (At) and
// when the slot was granted.
type Departure struct {
	At, Granted time.Time
}

// Fleet is a simulated fleet of callers on one key, on a fake clock: each
// caller reserves a slot (Reserve, through the shaper it belongs to),
// departs at it, hears the partner's answer RTT later (Answer, which gives
// the shaper its feedback), and reserves again at once; a reservation
// refused for its queue is tried again a second later. Nothing sleeps: the
// clock jumps from one event to the next, so a run over hours of the
// shapers' time takes as many store calls as it has events.
type Fleet struct {
	Clock   *timer.Fake
	Shapers []*shaper.Shaper // the processes; caller i reserves through Shapers[i%len]
	Key     string
	Callers int
	RTT     time.Duration // 0: 20 ms
	// Answer is the partner's answer to a request that departed at dep
	// through s; it calls s.Learn (or nothing).
	Answer func(s *shaper.Shaper, dep time.Time)
	// Deps are the departures so far, in the order they departed.
	Deps []Departure

	callers []fleetCaller
}

type fleetCaller struct {
	state   int // 0: reserve at at; 1: depart at at; 2: answered at at
	at      time.Time
	granted time.Time
	dep     time.Time
}

// Run runs the fleet for d of the clock's time, then returns (the callers
// keep their state for the next Run). Before calling each event it calls
// step, if not nil, with the instant the clock is about to reach: a test
// may act (Reset, Clamp) at an instant of its choice by returning true
// after acting, which makes Run look for the next event again.
func (f *Fleet) Run(t testing.TB, d time.Duration, step func(now time.Time) bool) {
	t.Helper()
	if f.RTT == 0 {
		f.RTT = 20 * time.Millisecond
	}
	now := f.Clock.Now()
	end := now.Add(d)
	if f.callers == nil {
		f.callers = make([]fleetCaller, f.Callers)
		for i := range f.callers {
			f.callers[i].at = now
		}
	}
	for {
		next := -1
		for i, c := range f.callers {
			if next < 0 || c.at.Before(f.callers[next].at) {
				next = i
			}
		}
		at := f.callers[next].at
		if at.After(end) {
			f.Clock.Advance(end.Sub(f.Clock.Now()))
			return
		}
		if at.After(f.Clock.Now()) {
			f.Clock.Advance(at.Sub(f.Clock.Now()))
		}
		if step != nil && step(f.Clock.Now()) {
			continue
		}
		c := &f.callers[next]
		s := f.Shapers[next%len(f.Shapers)]
		switch c.state {
		case 0:
			r, err := s.Reserve(bg, f.Key, 1)
			switch {
			case errors.Is(err, shaper.ErrQueueFull):
				c.at = c.at.Add(time.Second)
			case err != nil:
				t.Fatalf("Reserve: %v", err)
			default:
				c.state, c.granted, c.at = 1, f.Clock.Now(), r.Time()
			}
		case 1:
			f.Deps = append(f.Deps, Departure{At: c.at, Granted: c.granted})
			c.state, c.dep, c.at = 2, c.at, c.at.Add(f.RTT)
		case 2:
			if f.Answer != nil {
				f.Answer(s, c.dep)
			}
			c.state = 0
		}
	}
}

// Idle keeps the callers waiting to reserve from reserving for d: the
// fleet goes quiet once the slots it holds have gone.
func (f *Fleet) Idle(d time.Duration) {
	until := f.Clock.Now().Add(d)
	for i := range f.callers {
		if c := &f.callers[i]; c.state == 0 && c.at.Before(until) {
			c.at = until
		}
	}
}

// Spaced checks that every departure granted at or after from, and
// departing before until, left at least interval after the departure
// before it (any departure, granted before or after from): a pace the
// partner stated at from is kept whatever had been granted before.
func Spaced(deps []Departure, from, until time.Time, interval time.Duration) error {
	ds := slices.Clone(deps)
	slices.SortStableFunc(ds, func(a, b Departure) int { return a.At.Compare(b.At) })
	for i := 1; i < len(ds); i++ {
		d := ds[i]
		if d.Granted.Before(from) || !d.At.Before(until) {
			continue
		}
		// 1 µs for the float64 ms a store computes in.
		if gap := d.At.Sub(ds[i-1].At); gap < interval-time.Microsecond {
			return fmt.Errorf("a departure granted %v after the statement left %v after the one before (at %v), want at least %v",
				d.Granted.Sub(from), gap, ds[i-1].At.Sub(from), interval)
		}
	}
	return nil
}

// Within counts the departures granted at or after from that depart in
// [from, until).
func Within(deps []Departure, from, until time.Time) int {
	n := 0
	for _, d := range deps {
		if !d.Granted.Before(from) && !d.At.Before(from) && d.At.Before(until) {
			n++
		}
	}
	return n
}

// LearnedKeepsThePartnersWord runs a learning fleet (two shapers, as two
// processes, four callers) on c's store, on a fake clock, against partners
// that state a slow policy, a remaining count far from its reset, a
// clamp the user sets, a Reset, and a record whose version is about to
// wrap; and checks what the partner was told is kept: a policy's or a
// count's pace between departures however slow, a clamp's count before
// its reset, no burst after a Reset, and a fleet's record never taken for
// none.
func LearnedKeepsThePartnersWord(t *testing.T, c Candidate) {
	t.Helper()
	fleet := func(t *testing.T, name string, st shaper.Store, clk *timer.Fake) []*shaper.Shaper {
		var out []*shaper.Shaper
		for range 2 {
			s, err := shaper.New(st, shaper.PerSecond(100), shaper.WithClock(clk), shaper.WithName(name),
				shaper.WithPrefix(fmt.Sprintf("keep-%s-%s:", c.Name, name)),
				shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10), Floor: shaper.PerSecond(1)}))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		return out
	}
	// A stated policy, however slow, paces every departure granted after
	// the first response that stated it (issue 37, defect 18: GitHub's
	// unauthenticated 60/h let 42 go in 3 min, "1 per 30 s" 14 in a
	// minute).
	for _, pol := range []shaper.Rate{{Count: 60, Period: time.Hour}, {Count: 1, Period: 30 * time.Second}, {Count: 5, Period: time.Second}} {
		t.Run(fmt.Sprintf("policy %d per %v", pol.Count, pol.Period), func(t *testing.T) {
			clk := timer.NewFake(T0)
			var first time.Time
			f := &Fleet{Clock: clk, Shapers: fleet(t, "policy"+pol.Period.String(), c.New(), clk), Key: "k{1}", Callers: 4,
				Answer: func(s *shaper.Shaper, dep time.Time) {
					if first.IsZero() {
						first = clk.Now()
					}
					if err := s.Learn(bg, "k{1}", shaper.Feedback{Departed: dep, Policy: pol}); err != nil {
						t.Fatal(err)
					}
				}}
			f.Run(t, 3*time.Minute, nil)
			if err := Spaced(f.Deps, first, clk.Now(), pol.Period/time.Duration(pol.Count)); err != nil {
				t.Fatalf("%d departures granted after the policy departed in 3 min: %v", Within(f.Deps, first, clk.Now()), err)
			}
		})
	}
	// A remaining count until a reset far away (3 left, 3 min; 100 left,
	// an hour) paces the departures granted after it at reset/remaining:
	// at most the count departs before the reset (defects 18 and 22).
	for _, rc := range []struct {
		left  int64
		reset time.Duration
	}{{3, 3 * time.Minute}, {100, time.Hour}} {
		t.Run(fmt.Sprintf("remaining %d until %v", rc.left, rc.reset), func(t *testing.T) {
			clk := timer.NewFake(T0)
			var from, resetAt time.Time
			left := rc.left
			f := &Fleet{Clock: clk, Shapers: fleet(t, "remaining"+rc.reset.String(), c.New(), clk), Key: "k", Callers: 4,
				Answer: func(s *shaper.Shaper, dep time.Time) {
					if from.IsZero() {
						from, resetAt = clk.Now(), clk.Now().Add(rc.reset)
					} else if dep.After(from) && left > 0 {
						left--
					}
					fb := shaper.Feedback{Departed: dep, HasRemaining: true, Remaining: left, Reset: resetAt.Sub(clk.Now())}
					if left == 0 {
						fb.Pause = fb.Reset
					}
					if err := s.Learn(bg, "k", fb); err != nil {
						t.Fatal(err)
					}
				}}
			f.Run(t, min(rc.reset, 5*time.Minute), nil)
			if n := Within(f.Deps, from, resetAt); n > int(rc.left) {
				t.Fatalf("%d departures granted after %d remaining until a reset %v away departed before it", n, rc.left, rc.reset)
			}
			if err := Spaced(f.Deps, from, resetAt, rc.reset/time.Duration(rc.left)); err != nil {
				t.Fatalf("%d departures granted after the count departed in %v: %v", Within(f.Deps, from, clk.Now()), min(rc.reset, 5*time.Minute), err)
			}
		})
	}
	// A clamp the user (or a Route over the shaper) sets on a learning key
	// holds until its reset: the learned clamp renewed every 250 ms does
	// not replace it (defect 21: Clamp(2 left, 10 s) let 251 go).
	t.Run("clamp", func(t *testing.T) {
		clk := timer.NewFake(T0)
		ss := fleet(t, "clamp", c.New(), clk)
		f := &Fleet{Clock: clk, Shapers: ss, Key: "k", Callers: 4,
			Answer: func(s *shaper.Shaper, dep time.Time) {
				_ = s.Learn(bg, "k", shaper.Feedback{Departed: dep, Policy: shaper.PerSecond(50)})
			}}
		f.Run(t, 2*time.Second, nil)
		at := clk.Now()
		if err := ss[0].Clamp(bg, "k", 2, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		f.Run(t, 12*time.Second, nil)
		if n := Within(f.Deps, at, at.Add(10*time.Second)); n > 2 {
			t.Fatalf("Clamp(2 left, 10 s) on a learning key: %d departures granted after it departed before its reset", n)
		}
		// Once the slots granted under the clamp (up to MaxQueue, 30 s,
		// ahead) have gone, the key is back at its learned rate.
		f.Run(t, 35*time.Second, nil)
		if n := Within(f.Deps, at.Add(45*time.Second), at.Add(47*time.Second)); n < 95 {
			t.Fatalf("%d departures in 2 s, 35 s after the clamp's reset, at a learned 50/s", n)
		}
	})
	// A Reset forgets the key's schedule, not its learned pace: a key
	// learned at 10/s departs at 10/s right after it (defect 24: 60 in its
	// first second).
	t.Run("reset", func(t *testing.T) {
		clk := timer.NewFake(T0)
		ss := fleet(t, "reset", c.New(), clk)
		f := &Fleet{Clock: clk, Shapers: ss, Key: "k", Callers: 16,
			Answer: func(s *shaper.Shaper, dep time.Time) {
				_ = s.Learn(bg, "k", shaper.Feedback{Departed: dep, Policy: shaper.PerSecond(10)})
			}}
		f.Run(t, 3*time.Second, nil)
		at := clk.Now().Add(7 * time.Millisecond) // between two slots
		done := false
		f.Run(t, 2*time.Second, func(now time.Time) bool {
			if done || now.Before(at) {
				return false
			}
			done = true
			if err := ss[1].Reset(bg, "k"); err != nil {
				t.Fatal(err)
			}
			return true
		})
		if !done {
			t.Fatal("the Reset was never made")
		}
		if err := Spaced(f.Deps, at, clk.Now(), 100*time.Millisecond); err != nil {
			t.Fatalf("after a Reset: %v (%d departures in its first second)", err, Within(f.Deps, at, at.Add(time.Second)))
		}
	})
	// A record whose version is about to wrap: the fleet's next change
	// must not read as "no record" to a process that joins, which would
	// replace the fleet's record with its start (defect 27).
	t.Run("version", func(t *testing.T) {
		clk := timer.NewFake(T0)
		st := c.New()
		prefix := fmt.Sprintf("keep-wrap-%s:", c.Name)
		a, err := shaper.New(st, shaper.PerSecond(100), shaper.WithClock(clk), shaper.WithName("wrap"), shaper.WithPrefix(prefix),
			shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
		if err != nil {
			t.Fatal(err)
		}
		// The record at the last version there is, written as a fleet
		// would have after 2^64-1 changes.
		rec := learn.State{Ver: math.MaxUint64, Base: 10, T0: float64(T0.UnixMilli()), Event: learn.Started}
		ls := store.Of(st)
		if cur, _, err := ls.Learn(bg, &store.Learned{Base: prefix, Key: "k", KeySet: store.KeySet{Slot: "k"}}, &store.LearnOp{Now: float64(T0.UnixMilli()), Want: 0, Rec: rec.String(), TTL: 3.6e6}); err != nil || cur != rec.String() {
			t.Fatalf("writing the record: %q %v", cur, err)
		}
		// A changes it: the partner states 7/s.
		if err := a.Learn(bg, "k", shaper.Feedback{Policy: shaper.PerSecond(7)}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
		b, err := shaper.New(st, shaper.PerSecond(100), shaper.WithClock(clk), shaper.WithName("wrap"), shaper.WithPrefix(prefix),
			shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(10)}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Reserve(bg, "k", 1); err != nil { // B joins: it reads the record and clamps by it
			t.Fatal(err)
		}
		for name, s := range map[string]*shaper.Shaper{"the process that changed it": a, "a process that joined": b} {
			stat, err := s.Status(bg, "k", 1)
			if err != nil {
				t.Fatal(err)
			}
			if l := stat.Learned; l.Rate != 7 || l.Event != "advertised" {
				t.Fatalf("after the version's wrap %s reads %v (rate %v), want the stated 7/s", name, l, l.Rate)
			}
		}
	})
}

// statement is what a partner (or the user, with Clamp) said at At: until
// End, departures granted from At on leave at least Interval apart.
type statement struct {
	what     string
	at, end  time.Time
	interval time.Duration
}

// LearnedKeepsWhatIsStatedWhateverTheFeedback is the class test of what
// LearnedKeepsThePartnersWord checks instance by instance: seeded runs of
// a learning fleet (two shapers, restarted at times, four callers, a
// contract of 20/s) against a partner that changes its ways every few
// seconds — a hidden limit refusing with plain 429s, a stated policy
// (slow, fast, flipping), a fixed window with its remaining count and
// reset near or far (pausing the key when nothing is left), a storm of
// 503s with Retry-After — with the user's Clamp, Reset, and idle gaps
// between. It checks, replaying the departures, that every departure
// granted after a statement (a policy while it holds, a remaining count
// until its reset or the next count, a Clamp until its reset) left at
// least the stated interval after the one before it, and that the learned
// rate Status reports never exceeds the contract, nor a policy or a count
// in force.
func LearnedKeepsWhatIsStatedWhateverTheFeedback(t *testing.T, c Candidate, seeds int) {
	t.Helper()
	const contract = 20.0
	for seed := range uint64(seeds) {
		clk := timer.NewFake(T0)
		st := c.New()
		prefix := fmt.Sprintf("keepall%d-%s:", seed, c.Name)
		mk := func() *shaper.Shaper {
			s, err := shaper.New(st, shaper.PerSecond(contract), shaper.WithClock(clk), shaper.WithPrefix(prefix), shaper.WithMaxQueue(10*time.Second),
				shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(5), Floor: shaper.PerSecond(1)}))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		rng := rand.New(rand.NewPCG(seed, 37))
		var said []*statement
		// What is in force, for the Status check: the latest policy, and
		// the latest count (or Clamp).
		var policy, count *statement
		// state records a statement; it ends the one of its kind before
		// it, which the latest replaces (a policy) or a tighter one keeps
		// (a count, a Clamp).
		state := func(prev *statement, what string, interval, life time.Duration) *statement {
			now := clk.Now()
			if prev != nil && prev.end.After(now) {
				prev.end = now
			}
			said = append(said, &statement{what: what, at: now, end: now.Add(life), interval: interval})
			return said[len(said)-1]
		}
		// The partner's ways.
		mode := 0
		var limit, burst, tokens float64
		var last time.Time
		var pol shaper.Rate
		var flip int
		var window time.Duration
		var left, per int
		var windowEnd time.Time
		admit := func(at time.Time) bool { // the hidden token bucket
			if !last.IsZero() {
				tokens = min(burst, tokens+at.Sub(last).Seconds()*limit)
			}
			last = at
			if tokens >= 1 {
				tokens--
				return true
			}
			return false
		}
		checkRate := func(s *shaper.Shaper, when string) {
			stat, err := s.Status(bg, "k", 1)
			if err != nil {
				t.Fatalf("seed %d: Status: %v", seed, err)
			}
			r, now := stat.Learned.Rate, clk.Now()
			bound := contract
			for _, in := range []*statement{policy, count} {
				if in != nil && now.Before(in.end) && !now.Before(in.at) {
					bound = min(bound, float64(time.Second)/float64(in.interval))
				}
			}
			if r > bound*(1+1e-9) {
				rec, _, _ := store.Of(st).Learn(bg, &store.Learned{Base: prefix, Key: "k", KeySet: store.KeySet{Slot: "k"}}, &store.LearnOp{Now: float64(now.UnixMilli()), Want: learn.ReadOnly})
				t.Fatalf("seed %d, %s: the learned rate %v is above %v (the contract, a policy or a count in force): %v %q", seed, when, r, bound, stat.Learned, rec)
			}
		}
		f := &Fleet{Clock: clk, Shapers: []*shaper.Shaper{mk(), mk()}, Key: "k", Callers: 4}
		f.Answer = func(s *shaper.Shaper, dep time.Time) {
			fb := shaper.Feedback{Departed: dep}
			switch mode {
			case 0: // a hidden limit, plain 429s
				fb.Refused = !admit(dep)
			case 1: // a stated policy, flipping between two at each response at times
				fb.Refused = !admit(dep)
				flip++
				fb.Policy = pol
				if flip%2 == 0 && per > 0 {
					fb.Policy = shaper.Rate{Count: pol.Count + int64(per), Period: pol.Period}
				}
				if per > 0 { // both are in force (as each process last heard one or the other): the looser bounds
					fb2 := shaper.Rate{Count: pol.Count + int64(per), Period: pol.Period}
					interval := fb2.Period / time.Duration(fb2.Count)
					if policy == nil || policy.interval != interval || !clk.Now().Before(policy.end) {
						policy = state(policy, "policies flipping up to "+fb2.String(), interval, max(fb2.Period, 30*time.Second)) // half a policy's life: what each statement guarantees
					} else {
						policy.end = clk.Now().Add(max(fb2.Period, 30*time.Second)) // half a policy's life: what each statement guarantees
					}
				}
			case 2: // a fixed window and its count
				if !dep.Before(windowEnd) {
					left, windowEnd = per, windowEnd.Add(window*time.Duration(1+dep.Sub(windowEnd)/window))
				}
				fb.Refused = left == 0
				if left > 0 {
					left--
				}
				if !clk.Now().Before(windowEnd) { // answered after the window: the next one's count
					left, windowEnd = per, windowEnd.Add(window*time.Duration(1+clk.Now().Sub(windowEnd)/window))
				}
				fb.HasRemaining, fb.Remaining, fb.Reset = true, int64(left), windowEnd.Sub(clk.Now())
				if left == 0 {
					fb.Pause = min(fb.Reset, 3*time.Second) // as transport.WithMaxPause(3 s) would cut it
				}
			case 3: // a storm of 503s
				fb.Refused, fb.Pause = true, time.Second
			}
			if err := s.Learn(bg, "k", fb); err != nil {
				t.Fatalf("seed %d: Learn: %v", seed, err)
			}
			if fb.Policy != (shaper.Rate{}) && (mode != 1 || per == 0) {
				interval := fb.Policy.Period / time.Duration(fb.Policy.Count)
				if policy == nil || policy.interval != interval || !clk.Now().Before(policy.end) {
					policy = state(policy, "policy "+fb.Policy.String(), interval, max(fb.Policy.Period, 30*time.Second)) // half a policy's life: what each statement guarantees
				} else {
					policy.end = clk.Now().Add(max(fb.Policy.Period, 30*time.Second)) // half a policy's life: what each statement guarantees
				}
			}
			if fb.HasRemaining && fb.Remaining > 0 && fb.Reset > 0 {
				count = state(count, fmt.Sprintf("count %d in %v", fb.Remaining, fb.Reset), fb.Reset/time.Duration(fb.Remaining), fb.Reset)
			}
			checkRate(s, fmt.Sprintf("mode %d at %v", mode, clk.Now().Sub(T0)))
		}
		for range 40 {
			mode = [...]int{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3}[rng.IntN(20)]
			limit, burst = 2+rng.Float64()*30, float64(1+rng.IntN(5))
			switch mode {
			case 1:
				per = rng.IntN(2) * (1 + rng.IntN(40)) // flips between Count and Count+per, or states one
				if rng.IntN(4) != 0 {
					pol = shaper.Rate{Count: int64(1 + rng.IntN(20)), Period: time.Second}
				} else {
					pol = shaper.Rate{Count: int64(1 + rng.IntN(5)), Period: time.Duration(5+rng.IntN(25)) * time.Second}
				}
			case 2:
				if rng.IntN(4) != 0 {
					window, per = time.Duration(1+rng.IntN(10))*time.Second, 1+rng.IntN(60)
				} else {
					window, per = time.Duration(1+rng.IntN(10))*time.Minute, 60+rng.IntN(3000)
				}
				left, windowEnd = per, clk.Now().Add(window)
			}
			s := f.Shapers[rng.IntN(2)]
			switch rng.IntN(8) {
			case 0:
				if err := s.Reset(bg, "k"); err != nil {
					t.Fatalf("seed %d: Reset: %v", seed, err)
				}
			case 1: // a process restarts: what it held is gone, the store's record stays
				f.Shapers[rng.IntN(2)] = mk()
			case 2:
				n, reset := int64(1+rng.IntN(5)), time.Duration(1+rng.IntN(20))*time.Second
				if err := s.Clamp(bg, "k", n, reset); err != nil {
					t.Fatalf("seed %d: Clamp: %v", seed, err)
				}
				if float64(n) < 1+contract*reset.Seconds() {
					count = state(count, fmt.Sprintf("clamp %d in %v", n, reset), reset/time.Duration(n), reset)
				}
			case 3:
				f.Idle(time.Duration(rng.IntN(30)) * time.Second)
			}
			n0 := len(f.Deps)
			f.Run(t, time.Duration(500+rng.IntN(8000))*time.Millisecond, nil)
			if testing.Verbose() {
				stat, _ := f.Shapers[0].Status(bg, "k", 1)
				t.Logf("seed %d at %v: mode %d: %d departures, %d statements; %v next %v", seed, clk.Now().Sub(T0), mode, len(f.Deps)-n0, len(said), stat.Learned, stat.Next.Sub(clk.Now()))
			}
		}
		checked := 0
		for _, s := range said {
			if err := Spaced(f.Deps, s.at, s.end, s.interval); err != nil {
				t.Fatalf("seed %d: %s at %v (until %v): %v", seed, s.what, s.at.Sub(T0), s.end.Sub(T0), err)
			}
			checked += Within(f.Deps, s.at, s.end)
		}
		if len(said) < 10 || checked < 20 {
			t.Fatalf("seed %d: %d statements, %d departures under them: the run does not exercise the rule", seed, len(said), checked)
		}
		t.Logf("seed %d: %d departures, %d statements, %d checks of a departure against one", seed, len(f.Deps), len(said), checked)
	}
}
