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
	got, err := Parse(st.String())
	if err != nil || got != st {
		t.Fatalf("Parse(String()) = %+v, %v; want %+v", got, err, st)
	}
	if Version(st.String()) != st.Ver || Version("") != 0 {
		t.Fatalf("Version: %d, want %d", Version(st.String()), st.Ver)
	}
	for _, bad := range []string{"x", "1 2 3", "1 1 1 0 0 0 0 9 0 0 0 0", "1 1 1 3 0 0 0 1 0 0 0 0", "1 -1 1 0 0 0 0 1 0 0 0 0", "1 NaN 1 0 0 0 0 1 0 0 0 0", "1 1 1 0.5 0 0 0 1 0 0 0 0"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted a malformed record", bad)
		}
	}
}

// Before any feedback the rate starts at Start and doubles every
// SlowStart, up to the ceiling.
func TestSlowStart(t *testing.T) {
	t.Parallel()
	st := Start(0, 0, p)
	for _, c := range []struct{ at, want float64 }{{0, 10}, {1000, 20}, {2000, 40}, {10000, 200}} {
		if got := st.Rate(c.at, p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Rate(%v) = %v, want %v", c.at, got, c.want)
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
	if !st.Refuse(at+2000, at+Hold+1, 60, p) || st.Max != 60 {
		t.Fatalf("a refusal after Hold: Max %v, want the 60 accepted", st.Max)
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
	if r := st.Rate(120_000, p); r <= 25 {
		t.Fatalf("past the policy's end the rate %v did not probe", r)
	}
	if !st.Advertise(130_000, 500, 190_000, p) || st.Rate(131_000, p) != p.Ceiling {
		t.Fatalf("a policy above the ceiling: rate %v, want the ceiling %v", st.Rate(131_000, p), p.Ceiling)
	}
}

// After the plateau the probe finds a raised limit within seconds.
func TestTheProbeFindsARaisedLimit(t *testing.T) {
	t.Parallel()
	st := State{Ver: 1, Base: 18, Max: 20, T0: 0, Event: Refused}
	end := Recover + Plateau
	if r := st.Rate(end, p); math.Abs(r-Keep*20) > 1e-9 {
		t.Fatalf("rate at the plateau's end %v", r)
	}
	if r := st.Rate(end+3*Double/2, p); r < 3*20 {
		t.Fatalf("rate 3 s into the probe %v: a limit raised to 60 is not reached", r)
	}
	if r := st.Rate(end+Double/4, p); r > 1.1*20 {
		t.Fatalf("rate 0.5 s into the probe %v: not gentle", r)
	}
}

// A pause resumes at the rate held before it, from its end.
func TestAPauseResumesWhereItWas(t *testing.T) {
	t.Parallel()
	st := State{Ver: 1, Base: 36, Max: 40, T0: 0, Event: Refused}
	r := st.Rate(10_000, p)
	if !st.Pause(10_000, 5000, p) || st.T0 != 15_000 {
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
			switch rng.IntN(5) {
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
			for _, at := range []float64{now, now + 500, now + 20_000} {
				r := st.Rate(at, p)
				capped := (st.Cap > 0 && at < st.CapEnd) || (st.Policy > 0 && at < st.PolicyEnd)
				if r > p.Ceiling || (r < p.Floor && !capped) || math.IsNaN(r) {
					t.Fatalf("seed %d: Rate(%v) = %v outside [%v, %v]: %+v", seed, at, r, p.Floor, p.Ceiling, st)
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
