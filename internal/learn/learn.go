// Package learn is the arithmetic of a partner key's learned rate: the
// state a fleet shares in its store, the rate it gives at any instant, and
// how each kind of partner feedback changes it. It knows nothing of stores
// or HTTP; package shaper keeps a State per key in the store and turns its
// Rate into a clamp on the key's departures.
//
// The rate is a pure function of the state written at its last change
// and the clock, so every process of a fleet computes the same rate from
// the same record and writes nothing while nothing changes. After a
// refusal it follows four stages (see State.Rate and State.Probe):
//
//   - the decrease: to Beta times the rate the partner was found to accept
//     (Max): the share of the requests of the last second the partner
//     accepted, times the rate they were sent at, so a partner whose limit
//     halves is matched in one step, not in several multiplicative ones;
//     a refusal of the probe's first step finding at most Same above the
//     limit its plateau held keeps that limit (the partner's burst let
//     the step through for a while, and the count read it);
//   - the recovery: linearly back to Keep*Max within Recover;
//   - the plateau: Keep*Max for Plateau*2^Level, where Level counts the
//     refusals in a row that found the same limit (within Same): a stable
//     partner is probed ever more rarely, one that moves at once;
//   - the probe: gently at first, then faster and faster (ProbeFactor:
//     1.1, then 1.41 three times, then 2, 2.83, ... at most once a
//     second, a step near the limit found held for 2 s of answers), until
//     a refusal finds the limit again, or the rate before the step that
//     overran it: a partner whose limit did not move draws a few
//     refusals, one whose limit tripled is found at the fourth step.
//
// The probe advances with evidence, not with the clock alone: each step
// needs the fleet's answers (Evidence) to show the partner accepted, with
// no refusal, at least half the rate in force since the last change. A key
// left idle, or a fleet restarted, resumes at the rate its last step had
// earned, not at one the clock alone would have reached.
//
// That is AIMD's shape with both steps measured instead of fixed: the
// decrease is the partner's own share, the increase is exponential past a
// plateau, as TCP CUBIC's is past its inflection, and paced by the
// answers, as TCP's window grows with acknowledgements. Before any
// refusal the rate doubles at each step from Params.Start (slow start).
//
// A policy the partner states is adopted at once unless refusals found it
// accepting less (Found) and the policy claims more than the rate in
// force: then it only caps the rate, which gets there by probing. A pause
// is not a measurement: it holds the rate where it was (a 503 with
// Retry-After only pauses; a 429 with Retry-After is one refusal per
// pause, as the refusals of requests sent before its end change nothing).
package learn

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Event is what last changed a State.
type Event uint8

// The events.
const (
	None       Event = iota // no record yet
	Started                 // the first record: Params.Start
	Refused                 // a 429 or 503 lowered the rate
	Advertised              // the partner's stated policy (quota per window) set it
	Remaining               // the partner's remaining count until a reset capped it
	Paused                  // the partner asked for a pause (Retry-After)
	Probed                  // the fleet's answers showed the rate accepted: a probe's step up
)

var eventNames = [...]string{"none", "started", "refused", "advertised", "remaining", "paused", "probed"}

// String names the event.
func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return "event(" + strconv.Itoa(int(e)) + ")"
}

// The curve's constants (ms where a time).
const (
	Beta     = 0.9    // the decrease: the rate kept, relative to Max
	Keep     = 0.97   // the plateau: the rate held, relative to Max
	Recover  = 1000.0 // the recovery's length
	Plateau  = 5000.0 // the plateau's length at Level 0
	MaxLevel = 1      // the plateau is at most Plateau*2^MaxLevel long
	Same     = 0.15   // a refusal finding Max within this share of the last one raises Level
	MaxStep  = 8      // the probe's steps multiply the rate by ProbeFactor(k), k up to MaxStep
	Hold     = 1000.0 // a refusal of a request that departed within Hold of a change changes nothing
	// MinSample is how many answers the last second needs before a
	// decrease trusts the rate the partner accepted in it.
	MinSample = 5
)

// Params are a key's bounds, in requests per second.
type Params struct {
	Floor   float64 // the rate is never tuned below it (> 0); only the partner's own policy or remaining count holds it lower
	Ceiling float64 // nor above it (>= Floor): the user's contract
	Start   float64 // the first rate, before any feedback (Floor..Ceiling)
}

// State is what a fleet shares of one partner key. Rates are per second,
// instants ms on the shapers' clock.
type State struct {
	Ver       uint64  // grows with every change; a write expects the version it read
	Base      float64 // the rate at T0
	Max       float64 // the rate the partner was last found to accept (0: unknown, slow start)
	Level     int     // the refusals in a row that found the same Max (0..MaxLevel)
	Prev      float64 // Max before the last refusal (0: none)
	PrevLevel int     // Level then
	T0        float64 // the instant of the last change
	Event     Event   // what made it
	Policy    float64 // the rate the partner advertises (0: none)
	PolicyEnd float64 // until when Policy holds
	Cap       float64 // the rate the partner's remaining count allows until CapEnd (0: none)
	CapEnd    float64
	Found     float64 // the rate the last refusal found the partner accepting (0: none): a policy above it only caps the rate
	Step      int     // the probe's steps since the last refusal, policy or pause (0..MaxStep)
	// HoldFrom: a refusal of a request that departed before it changes
	// nothing. A change that lowers the rate (a refusal, a policy below
	// it, a pause's end) moves it to the change: the refusals of requests
	// sent faster say nothing of the rate in force. One that raises it
	// (a probe's step, a policy above) does not: they still say the
	// partner refused less.
	HoldFrom float64
	// Margin is the spacing margin (ms) the fleet keeps between the
	// key's departures until MarginEnd, beside the rate (shaper.Space):
	// every process's clamp carries it, not only the one that asked.
	Margin    float64
	MarginEnd float64
}

// MarginAt is the spacing margin in force at now, ms (0: none).
func (s *State) MarginAt(now float64) float64 {
	if s.Margin > 0 && now < s.MarginEnd {
		return s.Margin
	}
	return 0
}

// Space keeps a spacing margin of margin ms between the key's departures
// until end (shaper.Space). The widest margin in force holds: a narrower
// one extends its end, never narrows it, so that no process's margin is
// dropped by another's. It reports whether s changed (a call that
// neither widens the margin nor extends its end does not).
func (s *State) Space(now, margin, end float64) bool {
	if !(margin > 0) || !(end > now) || math.IsInf(margin, 1) {
		return false
	}
	m := max(margin, s.MarginAt(now))
	if m == s.Margin && end <= s.MarginEnd {
		return false
	}
	s.Ver = NextVersion(s.Ver)
	s.Margin, s.MarginEnd = m, max(end, s.MarginEnd)
	return true
}

// Rate is the rate in force at now: after a refusal, Base rising over
// Recover to Keep*Max, then held; after a step of the probe (or in slow
// start), Base; never above a policy or a remaining count in force.
func (s *State) Rate(now float64, p Params) float64 {
	if s.Event == None {
		return clampRate(p.Start, p)
	}
	r := s.Base
	if s.Max > 0 && s.Step == 0 {
		target := Keep * s.Max
		if t := max(0, now-s.T0); t < Recover {
			r = s.Base + (target-s.Base)*t/Recover
		} else {
			r = target
		}
	}
	r = clampRate(r, p)
	if s.Policy > 0 && now < s.PolicyEnd {
		r = min(r, s.Policy)
	}
	if s.Cap > 0 && now < s.CapEnd {
		r = min(r, s.Cap)
	}
	return r
}

func clampRate(r float64, p Params) float64 {
	if !(r >= p.Floor) { // NaN too
		r = p.Floor
	}
	return min(r, p.Ceiling)
}

// Start is the first record of a key, replacing a record of version ver
// (0: none): the rate p.Start from now, slow start.
func Start(ver uint64, now float64, p Params) State {
	return State{Ver: NextVersion(ver), Base: clampRate(p.Start, p), T0: now, Event: Started, HoldFrom: now}
}

// Refuse applies a refusal (429, 503) of a request that departed at
// departed. accepted is the rate the partner accepted, fleet-wide, in the
// last complete second before it (requests per second; < 0 when not
// known): while it refuses, that is its limit. The rate found is that,
// within half the rate in force and the rate itself (a sample polluted by
// slots taken before a change, or by a second the partner was not yet
// overloaded, never takes more than half in one step, as AIMD's decrease;
// unknown, it is half the rate). A refusal of a request that departed
// before the last change says nothing of the rate in force, and one
// within Hold after a refusal's change is the same overload: neither
// changes anything, so one overload lowers the rate once a second at
// most, however many refusals it draws. A refusal of a request that
// departed before the last change that raised the rate (a probe's step, a
// policy above the rate) counts: it found the partner refusing less. It
// reports whether s changed.
func (s *State) Refuse(now, departed, accepted float64, p Params) bool {
	if s.Event != None && departed < s.HoldFrom {
		return false
	}
	if s.Event == Refused && departed < s.T0+Hold {
		return false
	}
	r := s.Rate(departed, p)
	lo := r / 2
	if s.Event == Probed && s.Step > 0 && s.Max > 0 {
		// A probe's step overran: the rate before it had the fleet's
		// evidence, so the limit lies above that, however far below
		// this step (a step of 2.83 from 60/s against a limit of 60
		// found 85, half the step, and the fleet overran again).
		lo = min(lo, s.Base/ProbeFactor(s.Step))
	}
	found := lo // not measured: AIMD's halving, or the rate before the step
	if accepted >= 0 {
		found = min(max(accepted, lo), r)
	}
	if s.Event == Probed && s.Step == 1 && s.Max > 0 && found > s.Max && found <= (1+Same)*s.Max {
		// The probe's first step, just above the limit its plateau
		// held without a refusal, was refused, and found the partner
		// accepting a little more than that limit: the same limit,
		// and the count read the partner's burst, which let the step
		// through for a while (a bucket of 5 at 40/s took 42.7 in the
		// second measured, and the plateau at 97 % of that drew a
		// refusal). The limit stays. (A refusal of a later step says
		// the first was accepted: a limit raised by less than Same
		// is found so.)
		found = s.Max
	}
	found = clampRate(found, p)
	// A new overload: Level compares with the Max before it.
	s.Prev, s.PrevLevel = s.Max, s.Level
	level := 0
	if s.Prev > 0 && math.Abs(found-s.Prev) <= Same*s.Prev {
		level = min(s.PrevLevel+1, MaxLevel)
	}
	s.set(now, Refused)
	s.Max, s.Base, s.Level, s.Step, s.Found, s.HoldFrom = found, clampRate(found*Beta, p), level, 0, found, now
	return true
}

// Evidence is what the fleet's answers say of the rate in force: of the
// requests that departed in [From, To) (ms), Answered were answered and
// Accepted accepted.
type Evidence struct {
	From, To           float64
	Accepted, Answered int64
}

// ProbeFrom is the instant from which answers are evidence for the
// probe's next step, and whether the rate may step at now at all: in slow
// start and between steps, from the last change; after a refusal, a
// policy or a pause, from the end of the recovery, once the plateau
// (Plateau*2^Level) has passed.
func (s *State) ProbeFrom(now float64) (float64, bool) {
	if s.Event == None {
		return 0, false
	}
	if s.Max <= 0 || s.Step > 0 {
		return s.T0, now >= s.T0
	}
	plateau := Plateau * float64(int(1)<<min(max(s.Level, 0), MaxLevel))
	return s.T0 + Recover, now >= s.T0+Recover+plateau
}

// Probe steps the rate up at now when ev shows the partner accepted the
// rate in force: answers to requests that departed after ProbeFrom, none
// refused, at least half the rate in force. A step doubles the rate in
// slow start, multiplies it by ProbeFactor(k) at the probe's step k after a
// refusal; it never passes the ceiling, nor a policy or a count in force
// (a rate already there takes no step). Found stays: a policy above it
// is reached by steps, each with its evidence, never at once (a burst the
// partner lets through would show a rate it does not keep). It reports
// whether s changed.
func (s *State) Probe(now float64, ev Evidence, p Params) bool {
	from, ok := s.ProbeFrom(now)
	if !ok || ev.From < from || !(ev.To > ev.From) || ev.To > now || ev.Answered < 1 || ev.Accepted != ev.Answered {
		return false
	}
	r := s.Rate(now, p)
	accepted := float64(ev.Accepted) * 1000 / (ev.To - ev.From)
	if accepted < r/2 {
		return false // the fleet did not use the rate: nothing learned of a higher one
	}
	limit := p.Ceiling
	if s.Policy > 0 && now < s.PolicyEnd {
		limit = min(limit, s.Policy)
	}
	if s.Cap > 0 && now < s.CapEnd {
		limit = min(limit, s.Cap)
	}
	if r >= limit {
		return false
	}
	step := min(s.Step+1, MaxStep)
	factor := 2.0
	if s.Max > 0 {
		factor = ProbeFactor(step)
	}
	s.set(now, Probed)
	s.Base, s.Step = clampRate(r*factor, p), step
	return true
}

// ProbeFactor is what step k (1..MaxStep) of a probe after a refusal
// multiplies the rate by: 1.1 at the first step, 1.41 at the next three,
// then 2, 2.83, 4, ... The first step, from the plateau just under the
// limit found last, overruns a partner whose limit did not move by a
// tenth, not by two fifths; the next ones reach a limit that tripled at
// the fourth step (1.1*1.41^3 = 3.1) without overrunning it by more than
// 1.41 (a step of 2.83 past a limit of 60 drew 42 refusals in a fleet of
// four, from the slots granted before the first refusal came back); past
// them the steps grow fast, as TCP CUBIC probes slowly near its last
// maximum and fast away from it.
func ProbeFactor(k int) float64 {
	switch {
	case k <= 1:
		return 1.1
	case k <= 4:
		return math.Sqrt2
	}
	return math.Exp2(float64(k-3) / 2)
}

// Advertise applies a policy the partner states (quota per window, as a
// rate) holding until end. A policy it already holds only extends its end
// (changed false when that end is at most half a policy life earlier: the
// caller need not write it back on every response). A new policy sets the
// rate to it at once, unless it claims more than both the rate in force
// and the rate the last refusal found (Found): refusals bound what a
// policy may claim, so it then only caps the rate, which the probe raises
// towards it as the partner accepts (a partner stating one rate and
// refusing at a lower one is not followed off a cliff).
func (s *State) Advertise(now, rate, end float64, p Params) (changed bool) {
	rate = min(rate, p.Ceiling)
	if !(rate > 0) || !(end > now) {
		return false
	}
	held := s.Policy > 0 && now < s.PolicyEnd
	if held && s.Policy == rate {
		if s.PolicyEnd-now > (end-now)/2 {
			return false
		}
		s.Ver = NextVersion(s.Ver)
		s.PolicyEnd = end
		return true
	}
	if cur := s.Rate(now, p); s.Found > 0 && rate > s.Found && rate > cur {
		if held && s.Policy < rate && s.Policy > cur && s.PolicyEnd-now > (end-now)/2 {
			return false // a lower claim above the rate in force holds, far from its end: it stays
		}
		s.Ver = NextVersion(s.Ver)
		s.Policy, s.PolicyEnd = rate, end
		return true
	}
	if cur := s.Rate(now, p); rate < Beta*cur {
		s.HoldFrom = now // lowered as a refusal would: the refusals of faster requests say nothing more
	}
	s.set(now, Advertised)
	s.Policy, s.PolicyEnd = rate, end
	// The partner said what it accepts: the rate starts there (not a
	// step below it, as after a refusal) and stays (Rate caps it at the
	// policy while it holds).
	s.Max, s.Base, s.Level, s.Step = rate/Keep, rate, MaxLevel, 0
	return true
}

// Capped applies the partner's count of requests remaining until a reset
// reset ms away: until then the rate is at most remaining per reset, and
// the probe steps no higher. The latest count replaces the one in force,
// as Clamp's do, except one no tighter that ends no later: the one in
// force covers it (and nothing need be written). A count with none in
// force is recorded even when the rate is below it, so that no probe
// passes it before its reset. A count below 1 is no rate: nothing may
// depart before the reset, which is a pause (the caller's: shaper.Learn
// pauses the key until the reset), and Capped changes nothing.
func (s *State) Capped(now, remaining, reset float64, p Params) bool {
	if !(reset > 0) || !(remaining >= 1) {
		return false
	}
	cap := remaining * 1000 / reset
	if s.Cap > 0 && now < s.CapEnd && cap >= s.Cap && now+reset <= s.CapEnd {
		return false
	}
	lowers := cap < s.Rate(now, p)
	s.Ver = NextVersion(s.Ver)
	s.Cap, s.CapEnd = cap, now+reset
	if lowers && s.Event != Refused { // a refusal's event keeps its Hold: one overload, one decrease
		s.Event = Remaining
	}
	return true
}

// Pause applies a partner's pause of d ms: the rate resumes from where it
// is at the pause's end, paced, not in a burst, and regrows from there.
func (s *State) Pause(now, d float64, p Params) bool {
	if !(d > 0) {
		return false
	}
	r := s.Rate(now, p)
	end := now + d
	if end <= s.T0 {
		return false
	}
	s.set(end, Paused)
	s.Base, s.Step, s.HoldFrom = r, 0, end
	if s.Max > 0 {
		s.Max = r / Keep // hold r, then probe
	}
	return true
}

func (s *State) set(t0 float64, e Event) {
	s.Ver = NextVersion(s.Ver)
	s.T0, s.Event = t0, e
}

// String encodes s for a store: fields separated by spaces, the version
// first (a store compares it, and reads nothing else).
func (s State) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatUint(s.Ver, 10))
	for _, f := range []float64{s.Base, s.Max, float64(s.Level), s.Prev, float64(s.PrevLevel), s.T0, float64(s.Event), s.Policy, s.PolicyEnd, s.Cap, s.CapEnd,
		s.Found, float64(s.Step), s.HoldFrom, s.Margin, s.MarginEnd} {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	}
	return b.String()
}

// Parse decodes what String encoded; "" is the zero State (no record). A
// record of the 12 fields written before Found, Step and HoldFrom reads
// with them 0 (HoldFrom T0); one of the 15 written before Margin and
// MarginEnd, with no margin.
func Parse(v string) (State, error) {
	if v == "" {
		return State{}, nil
	}
	fs := strings.Fields(v)
	if len(fs) != 17 && len(fs) != 15 && len(fs) != 12 {
		return State{}, fmt.Errorf("learned record %q: %d fields, want 17", v, len(fs))
	}
	ver := Version(v)
	if ver == 0 {
		return State{}, fmt.Errorf("learned record %q: version %q is not a number from 1 to %d without a leading zero", v, fs[0], uint64(ReadOnly))
	}
	var n [16]float64
	var err error
	for i := range len(fs) - 1 {
		n[i], err = strconv.ParseFloat(fs[i+1], 64)
		if err != nil || math.IsNaN(n[i]) || math.IsInf(n[i], 0) || n[i] < 0 {
			return State{}, fmt.Errorf("learned record %q: field %d is not a finite number >= 0", v, i+2)
		}
	}
	if n[6] >= float64(len(eventNames)) || n[6] != math.Trunc(n[6]) {
		return State{}, fmt.Errorf("learned record %q: unknown event %v", v, n[6])
	}
	for _, i := range []int{2, 4} {
		if n[i] > MaxLevel || n[i] != math.Trunc(n[i]) {
			return State{}, fmt.Errorf("learned record %q: level %v out of range", v, n[i])
		}
	}
	if len(fs) == 12 {
		n[13] = n[5] // HoldFrom: T0, as Refuse read the older records
	}
	if n[12] > MaxStep || n[12] != math.Trunc(n[12]) {
		return State{}, fmt.Errorf("learned record %q: step %v out of range", v, n[12])
	}
	return State{Ver: ver, Base: n[0], Max: n[1], Level: int(n[2]), Prev: n[3], PrevLevel: int(n[4]), T0: n[5], Event: Event(n[6]),
		Policy: n[7], PolicyEnd: n[8], Cap: n[9], CapEnd: n[10], Found: n[11], Step: int(n[12]), HoldFrom: n[13], Margin: n[14], MarginEnd: n[15]}, nil
}

// Version reads the version of an encoded record without parsing the
// rest, as a store does (lua/learn.lua, string for string): its first
// field, a decimal number without a leading zero that fits 64 bits;
// anything else, and "", is version 0: no record.
func Version(v string) uint64 {
	f, _, _ := strings.Cut(v, " ")
	if f == "" || f[0] == '0' {
		return 0
	}
	n, err := strconv.ParseUint(f, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// ReadOnly is the version a caller expects when it only reads: no
// record ever has it (NextVersion never gives it), so a store writes
// nothing for it.
const ReadOnly = math.MaxUint64

// NextVersion is the version after v: v+1, and 1 after the last (then
// ReadOnly - 1), never 0 (no record) nor ReadOnly. A record's version
// that wrapped to 0 would read as none: a process joining the fleet
// would replace the fleet's record with its start.
func NextVersion(v uint64) uint64 {
	if v >= ReadOnly-1 {
		return 1
	}
	return v + 1
}
