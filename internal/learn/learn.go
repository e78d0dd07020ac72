// Package learn is the arithmetic of a partner key's learned rate: the
// state a fleet shares in its store, the rate it gives at any instant, and
// how each kind of partner feedback changes it. It knows nothing of stores
// or HTTP; package shaper keeps a State per key in the store and turns its
// Rate into a clamp on the key's departures.
//
// The rate is a pure function of the state written at its last change
// and the clock, so every process of a fleet computes the same rate from
// the same record and writes nothing while nothing changes. After a
// refusal it follows four stages (see State.Rate):
//
//   - the decrease: to Beta times the rate the partner was found to accept
//     (Max): the share of the requests of the last second the partner
//     accepted, times the rate they were sent at, so a partner whose limit
//     halves is matched in one step, not in several multiplicative ones;
//   - the recovery: linearly back to Keep*Max within Recover;
//   - the plateau: Keep*Max for Plateau*2^Level, where Level counts the
//     refusals in a row that found the same limit (within Same): a stable
//     partner is probed ever more rarely, one that moves at once;
//   - the probe: gently at first, then faster and faster (the rate is
//     2^((t/Double)^2) times the plateau's), until a refusal finds the
//     limit again: a partner whose limit did not move draws one or two
//     refusals, one whose limit tripled is found within three seconds.
//
// That is AIMD's shape with both steps measured instead of fixed: the
// decrease is the partner's own share, the increase is exponential past a
// plateau, as TCP CUBIC's is past its inflection. Before any refusal the
// rate doubles every SlowStart from Params.Start.
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
)

var eventNames = [...]string{"none", "started", "refused", "advertised", "remaining", "paused"}

// String names the event.
func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return "event(" + strconv.Itoa(int(e)) + ")"
}

// The curve's constants (ms where a time).
const (
	Beta      = 0.9    // the decrease: the rate kept, relative to Max
	Keep      = 0.97   // the plateau: the rate held, relative to Max
	Recover   = 1000.0 // the recovery's length
	Plateau   = 5000.0 // the plateau's length at Level 0
	MaxLevel  = 1      // the plateau is at most Plateau*2^MaxLevel long
	Same      = 0.15   // a refusal finding Max within this share of the last one raises Level
	Double    = 2000.0 // the probe: the rate doubles in Double, then every Double/2.4, faster and faster (2^(t/Double)^2)
	SlowStart = 1000.0 // before any refusal, the rate doubles this often
	Hold      = 1000.0 // a refusal of a request that departed within Hold of a change changes nothing
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
}

// Rate is the rate in force at now.
func (s *State) Rate(now float64, p Params) float64 {
	if s.Event == None {
		return clampRate(p.Start, p)
	}
	t := max(0, now-s.T0)
	var r float64
	if s.Max <= 0 {
		r = s.Base * math.Exp2(t/SlowStart)
	} else {
		target := Keep * s.Max
		plateau := Plateau * float64(int(1)<<min(max(s.Level, 0), MaxLevel))
		switch {
		case t < Recover:
			r = s.Base + (target-s.Base)*t/Recover
		case t < Recover+plateau:
			r = target
		default:
			u := (t - Recover - plateau) / Double
			r = target * math.Exp2(u*u)
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
	return State{Ver: NextVersion(ver), Base: clampRate(p.Start, p), T0: now, Event: Started}
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
// most, however many refusals it draws. It reports whether s changed.
func (s *State) Refuse(now, departed, accepted float64, p Params) bool {
	if s.Event != None && departed < s.T0 {
		return false
	}
	if s.Event == Refused && departed < s.T0+Hold {
		return false
	}
	r := s.Rate(departed, p)
	found := r / 2 // not measured: AIMD's halving
	if accepted >= 0 {
		found = min(max(accepted, r/2), r)
	}
	found = clampRate(found, p)
	// A new overload: Level compares with the Max before it.
	s.Prev, s.PrevLevel = s.Max, s.Level
	level := 0
	if s.Prev > 0 && math.Abs(found-s.Prev) <= Same*s.Prev {
		level = min(s.PrevLevel+1, MaxLevel)
	}
	s.set(now, Refused)
	s.Max, s.Base, s.Level = found, clampRate(found*Beta, p), level
	return true
}

// Advertise applies a policy the partner states (quota per window, as a
// rate) holding until end. A policy it already holds only extends its end
// (changed false when that end is at most half a policy life earlier: the
// caller need not write it back on every response). A new policy sets the
// rate to it at once.
func (s *State) Advertise(now, rate, end float64, p Params) (changed bool) {
	rate = min(rate, p.Ceiling)
	if !(rate > 0) || !(end > now) {
		return false
	}
	if s.Policy == rate && now < s.PolicyEnd {
		if s.PolicyEnd-now > (end-now)/2 {
			return false
		}
		s.Ver = NextVersion(s.Ver)
		s.PolicyEnd = end
		return true
	}
	s.set(now, Advertised)
	s.Policy, s.PolicyEnd = rate, end
	// The partner said what it accepts: the rate starts there (not a
	// step below it, as after a refusal) and stays (Rate caps it at the
	// policy while it holds).
	s.Max, s.Base, s.Level = rate/Keep, rate, MaxLevel
	return true
}

// Capped applies the partner's count of requests remaining until a reset
// reset ms away: until then the rate is at most remaining per reset. It
// changes nothing when that is no lower than the rate in force.
func (s *State) Capped(now, remaining, reset float64, p Params) bool {
	if !(reset > 0) || !(remaining >= 0) {
		return false
	}
	cap := max(remaining, 1) * 1000 / reset
	if cap >= s.Rate(now, p) {
		return false
	}
	s.Ver = NextVersion(s.Ver)
	s.Cap, s.CapEnd = cap, now+reset
	if s.Event != Refused { // a refusal's event keeps its Hold: one overload, one decrease
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
	s.Base = r
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
	for _, f := range []float64{s.Base, s.Max, float64(s.Level), s.Prev, float64(s.PrevLevel), s.T0, float64(s.Event), s.Policy, s.PolicyEnd, s.Cap, s.CapEnd} {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
	}
	return b.String()
}

// Parse decodes what String encoded; "" is the zero State (no record).
func Parse(v string) (State, error) {
	if v == "" {
		return State{}, nil
	}
	fs := strings.Fields(v)
	if len(fs) != 12 {
		return State{}, fmt.Errorf("learned record %q: %d fields, want 12", v, len(fs))
	}
	ver := Version(v)
	if ver == 0 {
		return State{}, fmt.Errorf("learned record %q: version %q is not a number from 1 to %d without a leading zero", v, fs[0], uint64(ReadOnly))
	}
	var n [11]float64
	var err error
	for i := range n {
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
	return State{Ver: ver, Base: n[0], Max: n[1], Level: int(n[2]), Prev: n[3], PrevLevel: int(n[4]), T0: n[5], Event: Event(n[6]),
		Policy: n[7], PolicyEnd: n[8], Cap: n[9], CapEnd: n[10]}, nil
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
