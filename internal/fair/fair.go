// Package fair is the arithmetic of fair turns among the flows waiting on
// one key: start-time fair queuing (SFQ) over the key's paced schedule,
// with strict priority classes and a bound on how long a lower class waits.
// Every store applies it as it is written here: memstore calls Turn, and
// lua/fair_turn.lua is the same function operation for operation, on the
// same float64 values and the same orders (sorted sets there, indexed heaps
// here), so that a fleet sharing Redis and a process using memory grant the
// same turns in the same order.
//
// A flow is a name within a priority class: the same name in two classes is
// two flows. Its tags are virtual times (Tag, exact to about 106 bits): a
// turn of cost c granted to a flow of weight w starts at S = max(V, F) and
// finishes at F = S + c/w, where V is the start tag of the last turn
// granted in the flow's class on the key (each class has its own virtual
// time, so that the turns of one class never move another's tags). The
// next turn goes to the waiting flow of highest priority with the least S;
// ties go to the flow served (or first seen) least recently. After MaxRun turns in a row over a lower class waiting,
// the next goes to the lower-class flow served (or first seen) least
// recently. A flow that arrives finds S = V: it is never queued behind
// another flow's backlog, and a flow that was idle keeps no credit.
//
// Who waits: each process sharing the key is an owner (a name of its
// choosing) that registers the flows it has requests of, with the cost and
// weight of each one's first request, and keeps them registered with each
// call until p.TTL after it. The turn goes to the best flow of every
// owner's; the caller is granted it when it has registered that flow, and
// is told so. So a process alone on a key is granted every turn it asks
// for. An owner whose TTL passes stops waiting, and its flows with it.
//
// Cost per call, flows n, classes k waiting: O((u + 1) log n + k) for u
// updates, plus, once per owner that expires, O(its flows log n). The
// state holds the flows registered, and at most MaxParked flows that
// stopped waiting with a finish tag ahead of their class's V.
package fair

import (
	"slices"
	"strconv"
	"strings"
)

// MaxTTL bounds Params.TTL (ms): a process that dies with requests waiting
// holds the key's turn at most this long, and a store refuses as corrupt an
// owner said to wait more than twice as long.
const MaxTTL = 60_000

// MaxParked bounds the flows kept after they stopped waiting, for their
// finish tags (a flow back before V reaches its tag resumes from it): past
// it, a flow that stops waiting takes the place of the one of its class V
// will reach first (or is forgotten itself, when it is that one or its
// class has none).
const MaxParked = 1 << 16

// MaxUpdates bounds the updates of one call (a caller with more sends the
// rest in its next calls).
const MaxUpdates = 256

// maxParked is MaxParked (tests lower it).
var maxParked = MaxParked

// Update is what an owner tells the key of one of its flows: registered
// (waiting) with the cost and weight of its first request, or leaving.
type Update struct {
	Name     string
	Priority int     // its class, higher first
	Weight   float64 // > 0
	Cost     float64 // >= 0
	// Last: the owner has no other request of the flow waiting, so its
	// registration ends once granted (until it registers again).
	Last bool
	// Leave: the owner no longer has requests of the flow; it asks for
	// nothing.
	Leave bool
}

// Params are one call's inputs besides the updates.
type Params struct {
	Now float64 // ms
	// TTL is how long (ms, at most MaxTTL) the caller counts as waiting
	// unless it calls again: a process that died holds no turn past it.
	TTL float64
	// MaxRun is how many turns in a row may go to higher classes while a
	// lower one waits; the next goes to the lower one (0: no bound).
	MaxRun int
	// Fresh: forget the caller's registrations before the updates (it
	// registers them anew, as after Reply.Renewed).
	Fresh bool
	// Hold: register and keep waiting, but take no turn.
	Hold bool
}

// Reply is Turn's answer.
type Reply struct {
	Granted  bool   // the caller has the turn, for the flow named here
	Name     string // the flow granted
	Priority int
	Start    Tag // the granted turn's start tag
	Finish   Tag // the granted flow's finish tag after the turn
	V        Tag // the granted flow's class's V after the call (Start)
	// Renewed: the key did not know the caller (first call, or its TTL
	// had passed and its registrations were dropped): only this call's
	// updates are registered, and the caller registers its other flows in
	// its next calls.
	Renewed bool
}

// flowID is a flow's identity: its class and name.
type flowID struct {
	class int
	name  string
}

// member is how lua/fair_turn.lua names the flow in the key's park: its
// class, a space, its name (the order of flows parked with equal tags).
func (id flowID) member() string { return strconv.Itoa(id.class) + " " + id.name }

// flow is what the key remembers of one flow.
type flow struct {
	id     flowID
	finish Tag     // F: the finish tag of its last turn
	seq    float64 // the key's counter when it was last served or first seen
	regs   []reg   // the owners waiting for it
	// positions in the heaps (-1: out)
	sPos, ePos, tPos, pPos int
}

// reg is one owner's registration of a flow.
type reg struct {
	owner  *owner
	cost   float64
	weight float64
	last   bool
}

func (f *flow) regOf(o *owner) int {
	for i := range f.regs {
		if f.regs[i].owner == o {
			return i
		}
	}
	return -1
}

// owner is a process waiting on the key.
type owner struct {
	name  string
	until float64 // waiting until, ms
	flows map[flowID]*flow
	pos   int
}

// class is one priority class's virtual time and flows: the waiting ones
// ordered three ways, and those parked.
type class struct {
	v Tag         // V: the start tag of the last turn granted in the class
	s heap[*flow] // every waiting flow, by seq
	e heap[*flow] // those whose finish V has reached (start V), by seq
	t heap[*flow] // those whose finish is ahead of V (start F), by finish, then seq; moved to e lazily
	p heap[*flow] // the flows no longer waiting whose finish is ahead of V: by finish, then member
}

// State is one key's fair state. The zero State is ready to use.
type State struct {
	N   float64 // a counter: turns granted and flows first seen
	Run float64 // turns in a row granted over a lower class waiting

	flows   map[flowID]*flow
	owners  map[string]*owner
	byUntil heap[*owner]
	waiting []int          // the classes with a flow waiting, ascending
	cls     map[int]*class // every class seen since the key started over
	parked  int            // flows parked, over every class
}

func bySeq(a, b *flow) bool { return a.seq < b.seq }

func byFinish(a, b *flow) bool {
	if a.finish != b.finish {
		return a.finish.Less(b.finish)
	}
	return a.seq < b.seq
}

func byParked(a, b *flow) bool {
	if a.finish != b.finish {
		return a.finish.Less(b.finish)
	}
	return a.id.member() < b.id.member()
}

func (s *State) reset() {
	*s = State{
		flows:   map[flowID]*flow{},
		owners:  map[string]*owner{},
		cls:     map[int]*class{},
		byUntil: heap[*owner]{less: func(a, b *owner) bool { return a.until < b.until || a.until == b.until && a.name < b.name }, pos: func(o *owner) *int { return &o.pos }},
	}
}

// class returns c's class, made on first use.
func (s *State) class(c int) *class {
	cl := s.cls[c]
	if cl == nil {
		cl = &class{
			s: heap[*flow]{less: bySeq, pos: func(f *flow) *int { return &f.sPos }},
			e: heap[*flow]{less: bySeq, pos: func(f *flow) *int { return &f.ePos }},
			t: heap[*flow]{less: byFinish, pos: func(f *flow) *int { return &f.tPos }},
			p: heap[*flow]{less: byParked, pos: func(f *flow) *int { return &f.pPos }},
		}
		s.cls[c] = cl
	}
	return cl
}

// V returns class c's virtual time.
func (s *State) V(c int) Tag {
	if cl := s.cls[c]; cl != nil {
		return cl.v
	}
	return Tag{}
}

// Turn applies one owner's call to the key: the owners whose TTL passed at
// p.Now stop waiting (when none is left, the key starts over: V = 0 in
// every class); who's updates are applied in order; who counts as waiting
// until p.Now + p.TTL while it has a flow registered; and unless p.Hold,
// the next turn is decided (see the package comment) and granted to who if
// who registered that flow. The caller checked the updates: weights > 0,
// costs >= 0, at most one per flow.
func (s *State) Turn(p Params, who string, ups []Update) Reply {
	if s.flows == nil {
		s.reset()
	}
	for {
		o, ok := s.byUntil.Min()
		if !ok || o.until >= p.Now {
			break
		}
		s.dropRegs(o)
		s.removeOwner(o)
	}
	if len(s.owners) == 0 { // nobody waits: the key starts over (its store may have let it expire)
		s.reset()
	}
	o := s.owners[who]
	reply := Reply{Renewed: o == nil}
	if o == nil {
		o = &owner{name: who, flows: map[flowID]*flow{}, pos: -1}
		s.owners[who] = o
	} else if p.Fresh {
		s.dropRegs(o)
	}
	for _, u := range ups {
		s.apply(o, u)
	}
	if len(o.flows) == 0 {
		s.removeOwner(o)
		return reply
	}
	o.until = p.Now + p.TTL
	if o.pos < 0 {
		s.byUntil.Push(o)
	} else {
		s.byUntil.Fix(o)
	}
	if !p.Hold {
		s.grant(p, o, &reply)
	}
	return reply
}

// apply applies one update of o's.
func (s *State) apply(o *owner, u Update) {
	id := flowID{u.Priority, u.Name}
	f := s.flows[id]
	if u.Leave {
		if f != nil && o.flows[id] != nil {
			s.unreg(o, f)
		}
		return
	}
	if f == nil {
		s.N++
		f = &flow{id: id, seq: s.N, sPos: -1, ePos: -1, tPos: -1, pPos: -1}
		s.flows[id] = f
	}
	r := reg{owner: o, cost: u.Cost, weight: u.Weight, last: u.Last}
	if i := f.regOf(o); i >= 0 {
		f.regs[i] = r
	} else {
		f.regs = append(f.regs, r)
		o.flows[id] = f
	}
	if f.sPos < 0 {
		s.wait(f)
	}
}

// wait enters f in its class's orders.
func (s *State) wait(f *flow) {
	cl := s.class(f.id.class)
	if f.pPos >= 0 {
		cl.p.Remove(f)
		s.parked--
	}
	if cl.s.Len() == 0 {
		i := 0
		for i < len(s.waiting) && s.waiting[i] < f.id.class {
			i++
		}
		s.waiting = append(s.waiting, 0)
		copy(s.waiting[i+1:], s.waiting[i:])
		s.waiting[i] = f.id.class
	}
	cl.s.Push(f)
	if cl.v.Less(f.finish) {
		cl.t.Push(f)
	} else {
		cl.e.Push(f)
	}
}

// unwait takes f, which no owner waits for any more, out of its class's
// orders: it is parked while its finish tag is ahead of its class's V,
// else forgotten; past MaxParked, the class's parked flow V reaches first
// is forgotten.
func (s *State) unwait(f *flow) {
	cl := s.cls[f.id.class]
	cl.s.Remove(f)
	cl.e.Remove(f)
	cl.t.Remove(f)
	if cl.s.Len() == 0 {
		for i, c := range s.waiting {
			if c == f.id.class {
				s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
				break
			}
		}
	}
	if !cl.v.Less(f.finish) {
		delete(s.flows, f.id)
		return
	}
	cl.p.Push(f)
	s.parked++
	if s.parked > maxParked {
		g, _ := cl.p.Min()
		cl.p.Remove(g)
		s.parked--
		delete(s.flows, g.id)
	}
}

// unreg ends o's registration of f.
func (s *State) unreg(o *owner, f *flow) {
	if i := f.regOf(o); i >= 0 {
		f.regs = append(f.regs[:i], f.regs[i+1:]...)
	}
	delete(o.flows, f.id)
	if len(f.regs) == 0 {
		s.unwait(f)
	}
}

// dropRegs ends every registration of o's, in the order of their members
// (the order lua/fair_turn.lua reads them in, which the park's bound can
// tell).
func (s *State) dropRegs(o *owner) {
	fs := make([]*flow, 0, len(o.flows))
	for _, f := range o.flows {
		fs = append(fs, f)
	}
	slices.SortFunc(fs, func(a, b *flow) int { return strings.Compare(a.id.member(), b.id.member()) })
	for _, f := range fs {
		s.unreg(o, f)
	}
}

func (s *State) removeOwner(o *owner) {
	s.byUntil.Remove(o)
	delete(s.owners, o.name)
}

// best returns class c's flow with the least start tag, the least recently
// served on a tie, after moving the flows V has reached from t to e.
func (s *State) best(c int) *flow {
	cl := s.cls[c]
	for {
		f, ok := cl.t.Min()
		if !ok || cl.v.Less(f.finish) {
			break
		}
		cl.t.Remove(f)
		cl.e.Push(f)
	}
	if f, ok := cl.e.Min(); ok {
		return f
	}
	f, _ := cl.t.Min()
	return f
}

// grant decides the turn, and grants it if it belongs to one of o's flows.
func (s *State) grant(p Params, o *owner, reply *Reply) {
	best := s.best(s.waiting[len(s.waiting)-1])
	// A lower class waiting after MaxRun turns in a row over it gets this
	// one: the flow of a lower class served (or first seen) least
	// recently, so that every lower class has its turn.
	starved := false
	if p.MaxRun > 0 && s.Run >= float64(p.MaxRun) {
		var low *flow
		for _, c := range s.waiting {
			if c >= best.id.class {
				break
			}
			if f, _ := s.cls[c].s.Min(); low == nil || f.seq < low.seq {
				low = f
			}
		}
		if low != nil {
			best, starved = low, true
		}
	}
	i := best.regOf(o)
	if i < 0 { // another owner's flow: it asks again within its TTL, or expires
		return
	}
	r := best.regs[i]
	cl := s.cls[best.id.class]
	cl.e.Remove(best)
	cl.t.Remove(best)
	st := cl.v.Max(best.finish)
	best.finish = st.Add(r.cost / r.weight)
	cl.v = st
	s.N++
	best.seq = s.N
	cl.s.Fix(best)
	if cl.v.Less(best.finish) {
		cl.t.Push(best)
	} else {
		cl.e.Push(best)
	}
	for { // forget the parked flows V has reached: they would start at V anyway
		f, ok := cl.p.Min()
		if !ok || cl.v.Less(f.finish) {
			break
		}
		cl.p.Remove(f)
		s.parked--
		delete(s.flows, f.id)
	}
	if lower := s.waiting[0] < best.id.class; starved || !lower {
		s.Run = 0
	} else {
		s.Run++
	}
	reply.Granted, reply.Name, reply.Priority = true, best.id.name, best.id.class
	reply.Start, reply.Finish, reply.V = st, best.finish, st
	if r.last {
		s.unreg(o, best)
		if len(o.flows) == 0 {
			s.removeOwner(o)
		}
	}
}

// Active reports whether any owner still counts as waiting at now.
func (s *State) Active(now float64) bool {
	for _, o := range s.owners {
		if o.until >= now {
			return true
		}
	}
	return false
}

// Flows returns how many flows the key holds: waiting, and parked.
func (s *State) Flows() int { return len(s.flows) }
