// Package fair is the arithmetic of fair turns among the flows waiting on
// one key: start-time fair queuing (SFQ) over the key's paced schedule,
// with strict priority classes and a bound on how long a lower class waits.
// Every store applies it as it is written here: memstore calls Turn, and
// lua/fair_turn.lua is the same function operation for operation, on the
// same float64 values, so that a fleet sharing Redis and a process using
// memory grant the same turns in the same order.
//
// A flow's tags are virtual times: a turn of cost c granted to a flow of
// weight w starts at S = max(V, F) and finishes at F = S + c/w, where V is
// the start tag of the last turn granted on the key. The next turn goes to
// the waiting flow of highest priority with the least S; ties go to the
// flow served (or first seen) least recently. After MaxRun turns in a row
// over a lower class waiting, the next goes to the lower-class flow served
// (or first seen) least recently. A flow that arrives finds
// S = V: it is never queued behind another flow's backlog, and a flow that
// was idle keeps no credit.
package fair

// Cand is a flow one process has requests waiting for, asking for the next
// turn: its name, weight (> 0), priority class (higher first) and the cost
// of its first request.
type Cand struct {
	Name     string
	Weight   float64
	Priority int
	Cost     float64
	// Last: the process has no other request of the flow waiting, so the
	// flow stops waiting once granted (until it asks again).
	Last bool
	// Leave: the flow no longer waits in this process (its requests
	// left); it asks for nothing.
	Leave bool
}

// Flow is what the key remembers of one flow.
type Flow struct {
	Finish   float64 // F: the finish tag of its last turn
	Until    float64 // waiting (active) until this instant, ms
	Priority int
	Seq      float64 // the key's counter when it was last served or first seen
}

// State is one key's fair state.
type State struct {
	V     float64 // the start tag of the last turn granted
	N     float64 // a counter: turns granted and flows first seen
	Run   float64 // turns in a row granted over a lower class waiting
	Flows map[string]*Flow
}

// Params are one call's inputs besides the candidates.
type Params struct {
	Now float64 // ms
	// TTL is how long (ms) the candidates count as waiting unless they ask
	// again: a process that died with requests waiting holds no turn past it.
	TTL float64
	// MaxRun is how many turns in a row may go to higher classes while a
	// lower one waits; the next goes to the lower one (0: no bound).
	MaxRun int
}

// Reply is Turn's answer.
type Reply struct {
	Granted int     // the index of the candidate granted the turn; -1: none
	Start   float64 // the granted turn's start tag
	V       float64 // V after the call
	// Finish and Seq hold, per candidate, its finish tag and its Seq after
	// the call (0 for a flow the key does not remember): a process orders
	// its own flows as the key does, by max(V, Finish) and then Seq.
	Finish []float64
	Seq    []float64
}

// start is f's start tag under s.
func (s *State) start(f *Flow) float64 { return max(s.V, f.Finish) }

// before reports whether a goes before b: higher priority, then the least
// start tag, then the least recently served.
func (s *State) before(a, b *Flow) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	sa, sb := s.start(a), s.start(b)
	if sa != sb {
		return sa < sb
	}
	return a.Seq < b.Seq
}

// Turn registers cands as waiting until p.Now + p.TTL and grants the next
// turn if it belongs to one of them (see the package comment), updating s.
// The caller checked the candidates: distinct names, weights > 0, costs
// >= 0.
func (s *State) Turn(p Params, cands []Cand) Reply {
	if s.Flows == nil || !s.Active(p.Now) {
		// Nobody waits: the key starts over (its store may have let it
		// expire already), every flow at V = 0.
		*s = State{Flows: map[string]*Flow{}}
	}
	// Forget the flows that stopped waiting and whose tags V has passed:
	// they would start at V anyway.
	for name, f := range s.Flows {
		if f.Until < p.Now && f.Finish <= s.V {
			delete(s.Flows, name)
		}
	}
	own := make([]*Flow, len(cands)) // the waiting candidates' flows (nil: leaving)
	asks := false
	for i, c := range cands {
		f := s.Flows[c.Name]
		if c.Leave {
			if f != nil {
				f.Until = 0
				if f.Finish <= s.V {
					delete(s.Flows, c.Name)
				}
			}
			continue
		}
		if f == nil {
			s.N++
			f = &Flow{Seq: s.N}
			s.Flows[c.Name] = f
		}
		f.Priority = c.Priority
		f.Until = p.Now + p.TTL
		own[i], asks = f, true
	}
	reply := Reply{Granted: -1}
	if asks {
		reply.Granted = s.grant(p, cands, own)
	}
	reply.V = s.V
	reply.Finish = make([]float64, len(cands))
	reply.Seq = make([]float64, len(cands))
	for i, c := range cands {
		if f := s.Flows[c.Name]; f != nil {
			reply.Finish[i], reply.Seq[i] = f.Finish, f.Seq
		}
	}
	if reply.Granted >= 0 {
		reply.Start = s.V
	}
	return reply
}

// grant picks the flow the turn belongs to and grants it if it is one of
// own (cands' flows), returning its index, or -1.
func (s *State) grant(p Params, cands []Cand, own []*Flow) int {
	var best *Flow
	for _, f := range s.Flows {
		if f.Until >= p.Now && (best == nil || s.before(f, best)) {
			best = f
		}
	}
	if best == nil {
		return -1
	}
	// A lower class waiting after MaxRun turns in a row over it gets this
	// one: the flow of a lower class served (or first seen) least
	// recently, so that every lower class has its turn.
	starved := false
	if p.MaxRun > 0 && s.Run >= float64(p.MaxRun) {
		var low *Flow
		for _, f := range s.Flows {
			if f.Until >= p.Now && f.Priority < best.Priority && (low == nil || f.Seq < low.Seq) {
				low = f
			}
		}
		if low != nil {
			best, starved = low, true
		}
	}
	at := -1
	for i, f := range own {
		if f != nil && f == best {
			at = i
		}
	}
	if at < 0 { // another process's flow: it asks again within its TTL, or expires
		return -1
	}
	f, c := own[at], cands[at]
	st := s.start(f)
	f.Finish = st + c.Cost/c.Weight
	s.V = st
	s.N++
	f.Seq = s.N
	lower := false
	for _, g := range s.Flows {
		if g.Until >= p.Now && g.Priority < f.Priority {
			lower = true
			break
		}
	}
	switch {
	case starved || !lower:
		s.Run = 0
	default:
		s.Run++
	}
	if c.Last {
		f.Until = 0
	}
	return at
}

// Active reports whether any flow still counts as waiting at now.
func (s *State) Active(now float64) bool {
	for _, f := range s.Flows {
		if f.Until >= now {
			return true
		}
	}
	return false
}
