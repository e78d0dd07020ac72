package learn

import (
	"math"
	"math/rand/v2"
	"testing"
)

var p = Params{Floor: 1, Ceiling: 200, Start: 10}

func TestEncodingRoundTrips(t *testing.T) {
	t.Parallel()
	st := Start(0, 1000, p)
	if !st.Refuse(5000, 4000, 20, p) {
		t.Fatal("a refusal after the start changed nothing")
	}
	st.Advertise(6000, 30, 66000, p)
	st.Capped(7000, 3, 1000, p)
	st.Space(7500, 4, 67500)
	got, err := Parse(st.String())
	if err != nil || got != st {
		t.Fatalf("Parse(String()) = %+v, %v; want %+v", got, err, st)
	}
	if Version(st.String()) != st.Ver || Version("") != 0 {
		t.Fatalf("Version: %d, want %d", Version(st.String()), st.Ver)
	}
	for _, bad := range []string{"x", "1 2 3", "1 1 1 0 0 0 0 9 0 0 0 0", "1 1 1 3 0 0 0 1 0 0 0 0", "1 -1 1 0 0 0 0 1 0 0 0 0", "1 NaN 1 0 0 0 0 1 0 0 0 0", "1 1 1 0.5 0 0 0 1 0 0 0 0",
		"1 1 1 0 0 0 0 1 0 0 0 0 0 9 0", "1 1 1 0 0 0 0 1 0 0 0 0 0 0.5 0", "1 1 1 0 0 0 0 1 0 0 0 0 0 0", "0 1 1 0 0 0 0 1 0 0 0 0 0 0 0",
		"01 1 1 0 0 0 0 1 0 0 0 0 0 0 0", "18446744073709551616 1 1 0 0 0 0 1 0 0 0 0 0 0 0"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted a malformed record", bad)
		}
	}
	// A record written before Found, Step and HoldFrom reads.
	old, err := Parse("7 10 20 1 0 0 5000 2 0 0 0 0")
	if err != nil || old.Ver != 7 || old.Max != 20 || old.HoldFrom != 5000 || old.Step != 0 {
		t.Fatalf("an older record: %+v, %v", old, err)
	}
	// And one written before Margin and MarginEnd, with no margin.
	old, err = Parse("7 10 20 1 0 0 5000 2 0 0 0 0 0 0 5000")
	if err != nil || old.Ver != 7 || old.HoldFrom != 5000 || old.MarginAt(5000) != 0 {
		t.Fatalf("a record without a margin: %+v, %v", old, err)
	}
	for _, bad := range []string{"1 1 1 0 0 0 0 1 0 0 0 0 0 0 0 -4 9", "1 1 1 0 0 0 0 1 0 0 0 0 0 0 0 4 NaN", "1 1 1 0 0 0 0 1 0 0 0 0 0 0 0 4"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted a malformed margin", bad)
		}
	}
}

// "Nothing remaining until the reset" is no rate: Capped records nothing
// for a count below 1 (the caller pauses the key until the reset), so a
// rate of one per reset never lets a request go before it (defect 102).
func TestNothingRemainingIsNoRate(t *testing.T) {
	t.Parallel()
	st := Start(0, 1000, p)
	before := st
	for _, n := range []float64{0, 0.5, -1, math.NaN()} {
		if st.Capped(2000, n, 5000, p) || st != before {
			t.Fatalf("Capped(%v remaining) changed the record: %+v", n, st)
		}
	}
	if !st.Capped(2000, 1, 5000, p) || st.Rate(2000, p) != 0.2 {
		t.Fatalf("Capped(1 remaining in 5 s): rate %v, want 0.2", st.Rate(2000, p))
	}
}

// Whatever else changes the record (refusals, policies, counts, pauses,
// the probe's steps, other margins), a margin Space set holds until its
// end, at least as wide as asked: every process's renewal of the learned
// clamp reads it from the record (defect 103: it was kept in the process
// that asked). A change raises the version; the record round-trips.
func TestAMarginHoldsWhateverElseChanges(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 103))
		st := Start(0, 0, p)
		now := 0.0
		type asked struct{ m, end float64 }
		var margins []asked
		for range 300 {
			now += rng.Float64() * 3000
			ver := st.Ver
			changed := false
			switch rng.IntN(7) {
			case 0:
				m, end := []float64{1, 2, 4, 10}[rng.IntN(4)], now+60_000
				changed = st.Space(now, m, end)
				margins = append(margins, asked{m, end})
			case 1:
				changed = st.Refuse(now, now-rng.Float64()*3000, rng.Float64()*300-50, p)
			case 2:
				changed = st.Advertise(now, rng.Float64()*300, now+rng.Float64()*60_000, p)
			case 3:
				changed = st.Capped(now, float64(rng.IntN(50)), rng.Float64()*10_000, p)
			case 4:
				changed = st.Pause(now, rng.Float64()*5000, p)
			case 5:
				changed = st.Probe(now, accepting(now, st.Rate(now, p)), p)
			case 6:
				changed = st.Space(now, 0, now+60_000) // no margin: nothing
				if changed {
					t.Fatalf("seed %d: a margin of 0 changed the record", seed)
				}
			}
			if changed != (st.Ver != ver) {
				t.Fatalf("seed %d: changed %v but version %d -> %d", seed, changed, ver, st.Ver)
			}
			for _, a := range margins {
				for _, at := range []float64{now, (now + a.end) / 2} {
					if at < a.end && st.MarginAt(at) < a.m {
						t.Fatalf("seed %d: a margin of %v ms asked until %v holds %v ms at %v: %+v", seed, a.m, a.end, st.MarginAt(at), at, st)
					}
				}
			}
			if got, err := Parse(st.String()); err != nil || got != st {
				t.Fatalf("seed %d: round trip %+v, %v; want %+v", seed, got, err, st)
			}
		}
		if len(margins) == 0 {
			t.Fatalf("seed %d: no margin asked", seed)
		}
	}
}

// A version never wraps to 0, which a store reads as no record (issue 37,
// defect 27), nor to ReadOnly; Version reads what lua/learn.lua reads, and
// nothing else, as a version.
func TestVersionsNeverWrapToNone(t *testing.T) {
	t.Parallel()
	for _, v := range []uint64{0, 1, 41, ReadOnly - 2, ReadOnly - 1, ReadOnly} {
		n := NextVersion(v)
		if n == 0 || n == ReadOnly || (v < ReadOnly-1 && n != v+1) {
			t.Errorf("NextVersion(%d) = %d", v, n)
		}
	}
	st := State{Ver: ReadOnly - 1, Base: 10, T0: 1, Event: Started, HoldFrom: 1}
	for _, change := range []func() bool{
		func() bool { return st.Refuse(5000, 4000, 8, p) },
		func() bool { return st.Advertise(6000, 3, 70_000, p) },
		func() bool { return st.Capped(7000, 1, 10_000, p) },
		func() bool { return st.Pause(8000, 500, p) },
	} {
		before := st.Ver
		if !change() || st.Ver == 0 || st.Ver == before || Version(st.String()) != st.Ver {
			t.Fatalf("a change from version %d gave version %d (read back as %d)", before, st.Ver, Version(st.String()))
		}
		st.Ver = ReadOnly - 1
	}
	for v, want := range map[string]uint64{"": 0, "0 1": 0, "007 1": 0, "7 1": 7, "+7 1": 0, "18446744073709551615 1": ReadOnly,
		"18446744073709551616 1": 0, "99999999999999999999 1": 0, " 7": 0, "7": 7, "7x 1": 0} {
		if got := Version(v); got != want {
			t.Errorf("Version(%q) = %d, want %d", v, got, want)
		}
	}
}

// accepting is the evidence of the partner accepting all of rate r in
// the second before now.
func accepting(now, r float64) Evidence {
	n := int64(math.Ceil(r))
	return Evidence{From: now - 1000, To: now, Accepted: n, Answered: n}
}

// Before any feedback the rate starts at Start and doubles at each step
// the partner's answers warrant, up to the ceiling; without them it
// stays, however long (issue 37, defect 23: the clock alone took an idle
// key to the ceiling).
func TestSlowStart(t *testing.T) {
	t.Parallel()
	st := Start(0, 0, p)
	for _, at := range []float64{0, 1000, 60_000, 1e9} {
		if got := st.Rate(at, p); got != 10 {
			t.Fatalf("Rate(%v) with no answers = %v, want the start, 10", at, got)
		}
	}
	now := 0.0
	for _, want := range []float64{20, 40, 80, 160, 200} {
		now += 1250
		if !st.Probe(now, accepting(now, st.Rate(now, p)), p) || st.Rate(now, p) != want || st.Event != Probed {
			t.Fatalf("a step at %v: rate %v, want %v (%+v)", now, st.Rate(now, p), want, st)
		}
	}
	if st.Probe(now+1250, accepting(now+1250, 200), p) {
		t.Fatal("a step past the ceiling")
	}
	// Evidence that does not warrant a step: a refusal among the answers,
	// too few of them, answers from before the last change.
	st = Start(0, 0, p)
	for _, ev := range []Evidence{
		{From: 0, To: 1000, Accepted: 9, Answered: 10},
		{From: 0, To: 1000, Accepted: 4, Answered: 4},
		{From: -500, To: 500, Accepted: 10, Answered: 10},
		{From: 0, To: 2000, Accepted: 20, Answered: 20}, // not over yet at 1500
	} {
		if st.Probe(1500, ev, p) {
			t.Fatalf("evidence %+v stepped the rate", ev)
		}
	}
}

// A partner whose limit halves is matched in one step: the rate it
// accepted in the last second.
func TestAShareFindsTheLimitInOneStep(t *testing.T) {
	t.Parallel()
	st := State{Ver: 3, Base: 40, Max: 40 / Keep, Level: 1, T0: 0, Event: Advertised}
	at := Recover + 1000.0
	if r := st.Rate(at, p); math.Abs(r-40) > 1e-9 {
		t.Fatalf("plateau rate %v, want 40", r)
	}
	// Not measured: half the rate.
	few := st
	few.Refuse(at, at, -1, p)
	if math.Abs(few.Max-20) > 1e-9 {
		t.Fatalf("Max after a refusal measuring nothing = %v, want 20", few.Max)
	}
	if !st.Refuse(at, at, 20, p) {
		t.Fatal("the refusal changed nothing")
	}
	if math.Abs(st.Max-20) > 1e-9 || math.Abs(st.Rate(at, p)-20*Beta) > 1e-9 || st.Event != Refused || st.Ver != 4 {
		t.Fatalf("after the refusal: %+v, rate %v; want Max 20, rate %v", st, st.Rate(at, p), 20*Beta)
	}
	// Back to Keep*Max within Recover, held on the plateau.
	if r := st.Rate(at+Recover+100, p); math.Abs(r-Keep*20) > 1e-9 {
		t.Fatalf("rate after the recovery %v, want %v", r, Keep*20)
	}
}

// A refusal of a request that departed before the last change changes
// nothing, nor one within Hold of a refusal's change; and one step never
// takes more than half the rate, whatever the sample says.
func TestOneOverloadLowersTheRateOnce(t *testing.T) {
	t.Parallel()
	st := State{Ver: 1, Base: 100, Max: 100, T0: 0, Event: Refused}
	at := 30_000.0
	r := st.Rate(at, p)
	if !st.Refuse(at, at, 0, p) || math.Abs(st.Max-r/2) > 1e-9 {
		t.Fatalf("a refusal measuring nothing accepted: Max %v, want half the rate %v", st.Max, r/2)
	}
	v := st.Ver
	if st.Refuse(at+10, at-1, 1, p) {
		t.Fatal("a refusal of a request that departed before the change changed the rate")
	}
	if st.Refuse(at+300, at+250, 1, p) || st.Ver != v {
		t.Fatal("a refusal within Hold of the last changed the rate")
	}
	if !st.Refuse(at+2000, at+Hold+1, 40, p) || st.Max != 40 {
		t.Fatalf("a refusal after Hold: Max %v, want the 40 accepted", st.Max)
	}
	r = st.Rate(at+3001, p)
	if !st.Refuse(at+4000, at+3001, 500, p) || st.Max > r {
		t.Fatalf("a sample above the rate in force (%v) raised it: Max %v", r, st.Max)
	}
}

// A stated policy sets the rate at once and the rate never probes past
// it while it holds; past its end the rate is free to probe again.
func TestAPolicyCapsTheRate(t *testing.T) {
	t.Parallel()
	st := Start(0, 0, p)
	if !st.Advertise(1000, 25, 61_000, p) {
		t.Fatal("a new policy changed nothing")
	}
	for at := 1000.0; at < 61_000; at += 500 {
		if r := st.Rate(at, p); math.Abs(r-25) > 1e-9 {
			t.Fatalf("Rate(%v) = %v under a policy of 25", at, r)
		}
	}
	if st.Advertise(2000, 25, 62_000, p) {
		t.Fatal("the same policy, far from its end, asked for a write")
	}
	if !st.Advertise(40_000, 25, 100_000, p) {
		t.Fatal("the same policy near its end was not extended")
	}
	if st.Probe(50_000, accepting(50_000, 25), p) {
		t.Fatal("the probe stepped past a policy in force")
	}
	if r := st.Rate(120_000, p); r != 25 {
		t.Fatalf("past the policy's end, with no answers, the rate %v moved", r)
	}
	if !st.Probe(120_000, accepting(120_000, 25), p) || st.Rate(120_000, p) <= 25 {
		t.Fatalf("past the policy's end the rate %v did not probe", st.Rate(120_000, p))
	}
	if !st.Advertise(130_000, 500, 190_000, p) || st.Rate(131_000, p) != p.Ceiling {
		t.Fatalf("a policy above the ceiling: rate %v, want the ceiling %v", st.Rate(131_000, p), p.Ceiling)
	}
}

// After the plateau the probe finds a raised limit within seconds, as
// the partner's answers show each step accepted; before the plateau's end
// it takes none. Its first step is gentle (1.1: a partner whose limit did
// not move is overrun by a tenth), and no step after it more than 1.41
// until the limit tripled (a step of 2.83 past a limit of 60 drew 42
// refusals in a fleet, from the slots granted before the refusal came
// back): a tripled limit is found at the fourth step.
func TestTheProbeFindsARaisedLimit(t *testing.T) {
	t.Parallel()
	st := State{Ver: 1, Base: 18, Max: 20, T0: 0, Event: Refused, Found: 20}
	end := Recover + Plateau
	if r := st.Rate(end, p); math.Abs(r-Keep*20) > 1e-9 {
		t.Fatalf("rate at the plateau's end %v", r)
	}
	if st.Probe(end-1, accepting(end-1, Keep*20), p) {
		t.Fatal("a step before the plateau's end")
	}
	if r := st.Rate(1e9, p); math.Abs(r-Keep*20) > 1e-9 {
		t.Fatalf("with no answers the rate moved to %v", r)
	}
	now := end
	var rates []float64
	for st.Rate(now, p) < 60 {
		if !st.Probe(now, accepting(now, st.Rate(now, p)), p) {
			t.Fatalf("no step at %v: %+v", now, st)
		}
		rates = append(rates, st.Rate(now, p))
		now += 1000
	}
	if now-end > 4000 || rates[0] > 1.11*Keep*20 {
		t.Fatalf("the probe's steps %v: a limit raised to 60 found after %v ms (want 4 s), or its first step not gentle", rates, now-end)
	}
	for i := 1; i < len(rates); i++ {
		if rates[i] > math.Sqrt2*rates[i-1]*(1+1e-9) {
			t.Fatalf("the probe's steps %v: step %d multiplied the rate by more than 1.41 before the limit tripled", rates, i+1)
		}
	}
}

// A policy above the rate the last refusal found, and above the rate in
// force, only caps the rate: a partner that states 100/s while it accepts
// 10/s, or states 100/s and 101/s in turn, is not followed off a cliff
// (issue 37, defect 20); a policy below is adopted at once, and one the
// key had no refusal against too.
func TestRefusalsBoundWhatAPolicyClaims(t *testing.T) {
	t.Parallel()
	st := Start(0, 0, p)
	if !st.Advertise(100, 100, 60_100, p) || st.Rate(100, p) != 100 {
		t.Fatalf("a first policy, no refusal against it: rate %v, want 100", st.Rate(100, p))
	}
	if !st.Refuse(2000, 1500, 12, p) || st.Found != 50 {
		t.Fatalf("a refusal: %+v", st)
	}
	for i, at := 0, 2100.0; at < 30_000; i, at = i+1, at+100 {
		st.Advertise(at, 100+float64(i%2), at+60_000, p)
		if r := st.Rate(at, p); r > 50 {
			t.Fatalf("at %v a flipping policy took the rate to %v above the 50 found", at, r)
		}
		if at > 3500 && int(at)%1000 == 0 {
			st.Refuse(at, at-50, 10, p) // the partner keeps refusing above 10/s
		}
	}
	if r := st.Rate(30_000, p); r > 12 || st.Policy < 100 {
		t.Fatalf("the rate after the refusals %v, policy %v: want near the 10 accepted, capped by the latest policy", r, st.Policy)
	}
	// A refusal of a request that departed before a policy raised the
	// rate still counts; before one lowered it, not.
	st = Start(0, 0, p)
	st.Advertise(100, 30, 60_100, p)
	st.Advertise(200, 40, 60_200, p)
	if !st.Refuse(300, 150, 20, p) {
		t.Fatal("a refusal of a request sent before a policy raised the rate changed nothing")
	}
	st.Advertise(2000, 5, 62_000, p)
	if st.Refuse(2100, 1900, 1, p) || st.Rate(2100, p) != 5 {
		t.Fatal("a refusal of a request sent before a policy lowered the rate changed it")
	}
}

// A pause resumes at the rate held before it, from its end.
func TestAPauseResumesWhereItWas(t *testing.T) {
	t.Parallel()
	st := State{Ver: 1, Base: 36, Max: 40, T0: 0, Event: Refused}
	r := st.Rate(10_000, p)
	if !st.Pause(10_000, 5000, p) || st.T0 != 15_000 || st.HoldFrom != 15_000 {
		t.Fatalf("pause: %+v", st)
	}
	for _, at := range []float64{10_000, 15_000, 15_000 + Recover + 1} {
		if got := st.Rate(at, p); math.Abs(got-r) > 1e-9 {
			t.Fatalf("Rate(%v) after the pause = %v, want %v", at, got, r)
		}
	}
	if st.Refuse(16_000, 14_000, 0, p) {
		t.Fatal("a refusal of a request sent before the pause's end changed the rate")
	}
}

// Whatever the feedback, the rate stays within the floor and the ceiling
// (the partner's own policy or remaining count alone may hold it lower), every change
// raises the version, and the record round-trips.
func TestRandomFeedbackKeepsTheBounds(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		st := State{}
		now := 0.0
		for range 400 {
			now += rng.Float64() * 2000
			ver := st.Ver
			changed := false
			switch rng.IntN(6) {
			case 5:
				at := now - rng.Float64()*3000
				n := int64(rng.IntN(40))
				changed = st.Probe(now, Evidence{From: at, To: at + 250 + rng.Float64()*2000, Accepted: n - int64(rng.IntN(2)), Answered: n}, p)
			case 0:
				if st.Event == None {
					st, changed = Start(st.Ver, now, p), true
				}
			case 1:
				changed = st.Refuse(now, now-rng.Float64()*3000, rng.Float64()*300-50, p)
			case 2:
				changed = st.Advertise(now, rng.Float64()*300, now+rng.Float64()*60_000, p)
			case 3:
				changed = st.Capped(now, float64(rng.IntN(50)), rng.Float64()*10_000, p)
			case 4:
				changed = st.Pause(now, rng.Float64()*5000, p)
			}
			if changed != (st.Ver != ver) {
				t.Fatalf("seed %d: changed %v but version %d -> %d", seed, changed, ver, st.Ver)
			}
			if st.Event == None {
				continue
			}
			// Between changes the rate never grows past what a refusal
			// found (the recovery to Keep*Max) or the rate in force: only
			// a change, a step of the probe with its evidence, raises it.
			free := st
			free.Policy, free.Cap = 0, 0 // a policy's or a count's end frees the rate, to the curve's
			bound := max(free.Rate(now, p), Keep*st.Max)
			for _, at := range []float64{now, now + 500, now + 20_000, now + 1e7} {
				r := st.Rate(at, p)
				capped := (st.Cap > 0 && at < st.CapEnd) || (st.Policy > 0 && at < st.PolicyEnd)
				if r > p.Ceiling || (r < p.Floor && !capped) || math.IsNaN(r) {
					t.Fatalf("seed %d: Rate(%v) = %v outside [%v, %v]: %+v", seed, at, r, p.Floor, p.Ceiling, st)
				}
				if r > bound*(1+1e-12) {
					t.Fatalf("seed %d: Rate(%v) = %v grew past %v with no change: %+v", seed, at, r, bound, st)
				}
				if st.Policy > 0 && at < st.PolicyEnd && r > st.Policy || st.Cap > 0 && at < st.CapEnd && r > st.Cap {
					t.Fatalf("seed %d: Rate(%v) = %v above a policy or count in force: %+v", seed, at, r, st)
				}
			}
			if got, err := Parse(st.String()); err != nil || got != st {
				t.Fatalf("seed %d: round trip %+v, %v; want %+v", seed, got, err, st)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Start(0, 1, p).String())
	f.Add("1 2 3")
	f.Add("")
	f.Fuzz(func(t *testing.T, v string) {
		st, err := Parse(v)
		if err != nil {
			return
		}
		if v != "" {
			back, err := Parse(st.String())
			if err != nil || back != st {
				t.Fatalf("Parse(%q) = %+v, which does not round-trip (%+v, %v)", v, st, back, err)
			}
		}
		if r := st.Rate(1e12, p); math.IsNaN(r) || r > p.Ceiling {
			t.Fatalf("Rate of a parsed record: %v", r)
		}
	})
}

// A remaining count that caps the rate right after a refusal (a 429 with
// rate-limit headers) does not open the refusal's Hold: the overload's
// next refusal changes nothing.
func TestACapKeepsARefusalsHold(t *testing.T) {
	t.Parallel()
	st := State{Ver: 1, Base: 36, Max: 40, T0: 0, Event: Refused}
	at := 20_000.0
	if !st.Refuse(at, at, 30, p) {
		t.Fatal("the refusal changed nothing")
	}
	if !st.Capped(at, 1, 1000, p) || st.Event != Refused {
		t.Fatalf("after the cap: event %v, want the refusal's", st.Event)
	}
	if st.Refuse(at+100, at+50, 10, p) {
		t.Fatal("a refusal within the Hold of one just capped lowered the rate again")
	}
}

// A refusal of a probe's step that overran finds the limit at the rate
// before that step at the least, not at half the step: the fleet had the
// partner's evidence for that rate. A step of 2.83 from 60/s refused with
// nothing measured found 85 (half of 170) and the fleet overran again.
func TestARefusedStepFallsBackToTheRateBeforeIt(t *testing.T) {
	t.Parallel()
	for step := 1; step <= MaxStep; step++ {
		before := 60.0
		st := State{Ver: 1, Base: before * ProbeFactor(step), Max: 20, T0: 0, Event: Probed, Found: 20, Step: step}
		r := st.Rate(100, p)
		if !st.Refuse(200, 150, -1, p) {
			t.Fatalf("step %d: the refusal changed nothing", step)
		}
		want := min(r/2, before)
		if math.Abs(st.Found-want) > 1e-9 || st.Found > before+1e-9 {
			t.Fatalf("step %d at %v/s: found %v, want %v (the rate before the step, or half the step)", step, r, st.Found, want)
		}
	}
	// Measured, the share the partner accepted stands, down to that floor.
	st := State{Ver: 1, Base: 60 * ProbeFactor(5), Max: 20, T0: 0, Event: Probed, Found: 20, Step: 5}
	if st.Refuse(200, 150, 70, p); st.Found != 70 {
		t.Fatalf("a measured 70/s: found %v", st.Found)
	}
	if st := (State{Ver: 1, Base: 60 * ProbeFactor(5), Max: 20, T0: 0, Event: Probed, Found: 20, Step: 5}); st.Refuse(200, 150, 10, p) && st.Found != 60 {
		t.Fatalf("a measured 10/s after a step from 60: found %v, want 60", st.Found)
	}
}

// A refusal of the probe's first step that finds the partner accepting a
// little more (within Same) than the limit its plateau held without a
// refusal keeps that limit: the count read the partner's burst, which let
// the step through for a while. One that finds less, or a refusal of a
// later step (the first was accepted: a limit raised a little), takes
// what it found.
func TestAProbesRefusalKeepsTheLimitItsPlateauHeld(t *testing.T) {
	t.Parallel()
	plateau := State{Ver: 1, Base: 18, Max: 20, T0: 0, Event: Refused, Found: 20}
	stepped := func(steps int) (State, float64) {
		st, now := plateau, Recover+Plateau
		for range steps {
			if !st.Probe(now, accepting(now, st.Rate(now, p)), p) {
				t.Fatalf("no step at %v: %+v", now, st)
			}
			now += 3000
		}
		return st, now
	}
	for _, c := range []struct {
		steps             int
		accepted, wantMax float64
		sameLimit         bool
	}{
		{steps: 1, accepted: 21, wantMax: 20, sameLimit: true},
		{steps: 1, accepted: 19, wantMax: 19, sameLimit: true},
		{steps: 2, accepted: 22.5, wantMax: 22.5, sameLimit: true},
		{steps: 2, accepted: 25, wantMax: 25},
		{steps: 2, accepted: 15, wantMax: 15.05}, // half the rate in force at least
	} {
		st, now := stepped(c.steps)
		r := st.Rate(now, p)
		if !st.Refuse(now, now, c.accepted, p) {
			t.Fatalf("%+v: the refusal changed nothing", c)
		}
		if math.Abs(st.Max-c.wantMax) > 0.05 {
			t.Errorf("step %d at %.1f/s, a refusal finding %v accepted: Max %v, want %v", c.steps, r, c.accepted, st.Max, c.wantMax)
		}
		if c.sameLimit != (st.Level == 1) {
			t.Errorf("step %d, a refusal finding %v accepted: Level %d (the same limit found: %v)", c.steps, c.accepted, st.Level, c.sameLimit)
		}
	}
}
