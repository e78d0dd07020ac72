package shaper

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/fair"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// Flow names whom a request is made for (a tenant, a user, a job group),
// with its share and class, so that the requests waiting on one key take
// turns fairly instead of in arrival order. Attach it to a request's ctx
// with WithFlow; Wait and Acquire then wait for the flow's turn (see
// docs/FAIRNESS.md).
type Flow struct {
	// Name identifies the flow among the flows of its class on a key,
	// fleet-wide ("" is a flow too); at most MaxFlowName bytes. One name in
	// two classes is two flows, each with its own queue and share.
	Name string
	// Weight is the flow's share relative to the other flows of its class
	// waiting on the key (0: 1); in [MinWeight, MaxWeight].
	Weight float64
	// Priority is the flow's class: a class's turns come before those of
	// every lower class, but for one turn in WithMaxPriorityRun + 1 while
	// a lower class waits (the rule against starvation).
	Priority Priority
}

// Priority is a flow's class: higher first.
type Priority int

// The priority classes named here; any value in [MinPriority, MaxPriority]
// is a class.
const (
	Batch       Priority = -1
	Normal      Priority = 0 // the zero Flow's
	Interactive Priority = 1
)

// Bounds of a Flow's fields.
const (
	MaxFlowName          = 256
	MinWeight            = 1e-6
	MaxWeight            = 1e6
	MinPriority Priority = -100
	MaxPriority Priority = 100
)

// DefaultMaxPriorityRun is how many turns in a row higher classes take
// while a lower class waits, unless WithMaxPriorityRun says otherwise: the
// lower classes then get the next one, so they keep at least a tenth of
// the key's turns between them.
const DefaultMaxPriorityRun = 9

// WithMaxPriorityRun sets how many turns in a row the flows of higher
// classes may take while a flow of a lower class waits on the same key
// (default DefaultMaxPriorityRun); the next turn goes to the lower-class
// flow served least recently, so the lower classes keep at least 1/(n+1)
// of the key's turns between them (of its rate when the costs are equal).
// 0 is strict priority: a lower class waits as long as a higher one has
// requests waiting. The shapers sharing a key in a fleet should agree on
// it: each turn follows the n of the process that asks for it.
func WithMaxPriorityRun(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.err = &ConfigError{Algorithm: "fair", Field: "MaxPriorityRun", Value: n, Reason: "must be >= 0"}
			return
		}
		c.maxRun, c.maxRunSet = n, true
	}
}

// ErrInvalidFlow is matched by a *FlowError.
var ErrInvalidFlow = errors.New("throttlekit: invalid flow")

// FlowError reports a Flow refused at the boundary; nothing was reserved.
type FlowError struct {
	Flow   Flow
	Reason string
}

// Error says what was wrong with the flow.
func (e *FlowError) Error() string {
	name := e.Flow.Name
	if len(name) > 64 {
		cut := 64
		for cut > 0 && !utf8.RuneStart(name[cut]) { // whole characters
			cut--
		}
		name = name[:cut] + "..."
	}
	return fmt.Sprintf("throttlekit: flow %q: %s", name, e.Reason)
}

// Unwrap returns ErrInvalidFlow.
func (e *FlowError) Unwrap() error { return ErrInvalidFlow }

type flowCtxKey struct{}

// WithFlow returns a copy of ctx carrying f: Wait and Acquire of a shaper
// given that ctx wait for f's turn among the flows waiting on their key.
// The transport (the request's ctx) and the queue (the job's ctx) pass it
// on. Reserve and Allow ignore it: their slot is known at once.
func WithFlow(ctx context.Context, f Flow) context.Context {
	return context.WithValue(ctx, flowCtxKey{}, f)
}

// FlowOf returns the flow ctx carries, if any (see WithFlow).
func FlowOf(ctx context.Context) (Flow, bool) {
	f, ok := ctx.Value(flowCtxKey{}).(Flow)
	return f, ok
}

// Validate returns a *FlowError if f is out of bounds (see Flow's fields):
// what Wait, Acquire and AwaitTurn would refuse it with, for a scheduler
// that takes requests before they wait (the queue's Submit).
func (f Flow) Validate() error { return f.check() }

// check refuses a flow out of bounds, and sets the default weight.
func (f *Flow) check() error {
	switch {
	case len(f.Name) > MaxFlowName:
		return &FlowError{Flow: *f, Reason: fmt.Sprintf("name longer than MaxFlowName (%d bytes)", MaxFlowName)}
	case f.Weight == 0:
		f.Weight = 1
	case !(f.Weight >= MinWeight && f.Weight <= MaxWeight): // NaN too
		return &FlowError{Flow: *f, Reason: fmt.Sprintf("weight %v out of [%v, %v]", f.Weight, MinWeight, MaxWeight)}
	}
	if f.Priority < MinPriority || f.Priority > MaxPriority {
		return &FlowError{Flow: *f, Reason: fmt.Sprintf("priority %d out of [%d, %d]", f.Priority, MinPriority, MaxPriority)}
	}
	return nil
}

// contention is how long after a turn went to another process's flow the
// dispatcher keeps asking a slot ahead.
const contention = 10 * time.Second

// maxTurnTTL is fair.MaxTTL: the longest a process's registrations live
// in the store without a call.
const maxTurnTTL = fair.MaxTTL * time.Millisecond

// fairRooms holds, per key, the requests of this process waiting for
// their flow's turn.
type fairRooms struct {
	mu     sync.Mutex
	rooms  map[string]*fairRoom
	opened uint64 // rooms opened: every 256th sweeps the idle ones
	owner  string // this shaper's name among the processes sharing a key's turns
}

// ownerName returns fr's owner name, drawing it on first use. The caller
// holds fr.mu.
func (fr *fairRooms) ownerName() string {
	if fr.owner == "" {
		fr.owner = strconv.FormatUint(rand.Uint64(), 36)
	}
	return fr.owner
}

// sweep forgets the rooms nobody waits in whose last slot has passed. The
// caller holds fr.mu.
func (fr *fairRooms) sweep(now time.Time) {
	for key, rm := range fr.rooms {
		if !rm.running && rm.waiting == 0 && !rm.lead.After(now) {
			delete(fr.rooms, key)
		}
	}
}

// flowKey is a flow's identity: its name within its class.
type flowKey struct {
	name string
	prio Priority
}

// fairRoom is one key's waiting requests, by flow. Its dispatcher (one
// goroutine while any request waits) asks the store whose turn is next,
// reserves that flow's first request's slot, hands it over, and asks again
// once the slot has come: so at most one slot of the process runs ahead of
// the turns, and a request that arrives is at most that slot behind. The
// room outlives its dispatcher until that slot has come, so that requests
// arriving one at a time meanwhile wait in it too, where a later flow's
// request can go before them.
//
// The store knows the room's flows by their registrations (fair.Update):
// each flow with requests is registered with its first request's cost and
// weight, and the store grants the turn to any of them, so that the room
// never sorts its flows. Each call tells the store what changed since the
// last: the flows that arrived or whose first request changed (dirty), and
// the ones that left.
type fairRoom struct {
	key       string
	flows     map[flowKey]*flowQueue
	classes   map[Priority]*classRoom
	waiting   int
	spans     time.Duration // the waiting requests' spans, summed
	running   bool          // a dispatcher serves the room
	lead      time.Time     // the last slot the dispatcher reserved
	contended time.Time     // when a turn last went to another process's flow
	refresh   time.Time     // when the room calls the store at the latest, to keep its registrations
	arrivals  uint64        // orders the requests
	calls     uint64        // numbers the calls to the store
	dirty     []*flowQueue  // flows whose registration the store has not heard, in order
	leaving   []fair.Update // flows that left, to tell the store
	onLocal   bool          // the room's last turn was decided locally (the store failed)
	local     *fair.State   // the turns taken while the store fails
	kick      chan struct{} // wakes the dispatcher (the room emptied)
}

// classRoom is what the admission estimate reads of one class's requests in
// a room: how many wait and their spans, and which flows go first at V.
type classRoom struct {
	requests int
	spans    time.Duration
	v        float64 // the class's V, as the store last said
	// The flows whose finish tag V has reached start at V: they go before
	// a request of any flow with requests before it, and before a new
	// flow. atV counts them, atVSpans sums their first requests' spans;
	// the others wait in ahead until V reaches them.
	atV      int
	atVSpans time.Duration
	ahead    flowHeap
}

// flowQueue is one flow's requests in a room, in arrival order.
type flowQueue struct {
	key      flowKey
	q        []*fairWaiter // q[head:] waits, but for the ones gone
	head     int
	n        int           // requests waiting
	cost     int64         // their costs, summed
	spans    time.Duration // their spans, summed
	finish   float64       // its finish tag, as the store last said (-Inf: never)
	headSpan time.Duration // the first request's span, as counted in atVSpans
	pos      int           // in its class's ahead heap; -1 when at V
	held     bool          // the store may hold its registration
	sent     fair.Update   // the registration last sent
	call     uint64        // the call that last sent it
	dirty    bool          // in rm.dirty
	gone     bool          // left the room
}

// first returns fq's first request still waiting.
func (fq *flowQueue) first() *fairWaiter {
	for fq.head < len(fq.q) && fq.q[fq.head].taken {
		fq.q[fq.head] = nil
		fq.head++
	}
	if fq.head == len(fq.q) {
		return nil
	}
	return fq.q[fq.head]
}

// update is fq's registration as the store should hold it.
func (fq *flowQueue) update() fair.Update {
	w := fq.first()
	return fair.Update{Name: fq.key.name, Priority: int(fq.key.prio), Weight: w.weight, Cost: float64(w.cost), Last: fq.n == 1}
}

type fairWaiter struct {
	ctx    context.Context
	cost   int64
	weight float64
	span   time.Duration // how long its slot spaces the key (span)
	out    chan fairResult
	seq    uint64 // its arrival in the room
	// Under fairRooms.mu: taken out of its flow's queue (served, refused
	// or left), and its caller left.
	taken, left bool
}

type fairResult struct {
	r   Reservation
	err error
}

// flowHeap orders flows by finish tag (container/heap).
type flowHeap []*flowQueue

func (h flowHeap) Len() int           { return len(h) }
func (h flowHeap) Less(i, j int) bool { return h[i].finish < h[j].finish }
func (h flowHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i, j
}
func (h *flowHeap) Push(x any) {
	fq := x.(*flowQueue)
	fq.pos = len(*h)
	*h = append(*h, fq)
}
func (h *flowHeap) Pop() any {
	old := *h
	fq := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	fq.pos = -1
	return fq
}

// class returns rm's classRoom of p.
func (rm *fairRoom) class(p Priority) *classRoom {
	cr := rm.classes[p]
	if cr == nil {
		cr = &classRoom{}
		rm.classes[p] = cr
	}
	return cr
}

// place counts fq, whose first request spans headSpan, at V or ahead, by
// its finish tag.
func (rm *fairRoom) place(fq *flowQueue) {
	cr := rm.class(fq.key.prio)
	if fq.finish > cr.v {
		heap.Push(&cr.ahead, fq)
		return
	}
	cr.atV++
	cr.atVSpans += fq.headSpan
}

// unplace takes fq out of its class's count.
func (rm *fairRoom) unplace(fq *flowQueue) {
	cr := rm.classes[fq.key.prio]
	if fq.pos >= 0 {
		heap.Remove(&cr.ahead, fq.pos)
		return
	}
	cr.atV--
	cr.atVSpans -= fq.headSpan
}

// setV records the V of class p the store said: the flows it reached
// start at V.
func (rm *fairRoom) setV(p Priority, v float64) {
	cr := rm.classes[p]
	if cr == nil || v <= cr.v {
		return
	}
	cr.v = v
	for len(cr.ahead) > 0 && cr.ahead[0].finish <= v {
		fq := heap.Pop(&cr.ahead).(*flowQueue)
		cr.atV++
		cr.atVSpans += fq.headSpan
	}
}

// headChanged records that fq's first request changed: the store must hear
// its registration again, and the estimate count the new one's span.
func (rm *fairRoom) headChanged(fq *flowQueue) {
	if w := fq.first(); w != nil && fq.pos < 0 {
		rm.classes[fq.key.prio].atVSpans += w.span - fq.headSpan
		fq.headSpan = w.span
	} else if w != nil {
		fq.headSpan = w.span
	}
	if !fq.dirty {
		fq.dirty = true
		rm.dirty = append(rm.dirty, fq)
	}
}

// join queues w, of flow f, in rm. The caller holds fairRooms.mu.
func (rm *fairRoom) join(f Flow, w *fairWaiter) *flowQueue {
	k := flowKey{f.Name, f.Priority}
	fq := rm.flows[k]
	if fq == nil {
		fq = &flowQueue{key: k, finish: math.Inf(-1), pos: -1, headSpan: w.span}
		rm.flows[k] = fq
		rm.place(fq)
	}
	rm.arrivals++
	w.seq = rm.arrivals
	fq.q = append(fq.q, w)
	fq.n++
	fq.cost += w.cost
	fq.spans += w.span
	cr := rm.class(f.Priority)
	cr.requests++
	cr.spans += w.span
	rm.waiting++
	rm.spans += w.span
	if fq.n == 1 {
		rm.headChanged(fq)
	}
	return fq
}

// take takes w, waiting in fq, out of rm (served or gone), and tells the
// store what changed: fq's new first request, or that fq left.
func (rm *fairRoom) take(fq *flowQueue, w *fairWaiter) {
	wasHead := fq.first() == w
	w.taken = true
	fq.n--
	fq.cost -= w.cost
	fq.spans -= w.span
	cr := rm.classes[fq.key.prio]
	cr.requests--
	cr.spans -= w.span
	rm.waiting--
	rm.spans -= w.span
	if fq.n == 0 {
		rm.forget(fq)
		return
	}
	if fq.head > 32 && fq.head > len(fq.q)/2 { // compact
		fq.q = append(fq.q[:0], fq.q[fq.head:]...)
		fq.head = 0
	}
	if wasHead {
		rm.headChanged(fq)
	}
}

// forget drops fq, empty, from rm: the store is told it left with the
// next call if it may hold its registration.
func (rm *fairRoom) forget(fq *flowQueue) {
	rm.unplace(fq)
	delete(rm.flows, fq.key)
	if cr := rm.classes[fq.key.prio]; cr.requests == 0 && cr.atV == 0 && len(cr.ahead) == 0 {
		delete(rm.classes, fq.key.prio)
	}
	fq.gone = true
	if fq.held {
		rm.leaving = append(rm.leaving, fair.Update{Name: fq.key.name, Priority: int(fq.key.prio), Leave: true})
	}
}

// updates returns what the next call tells the store: the flows that left,
// then the registrations it has not heard, at most fair.MaxUpdates. The
// caller holds fairRooms.mu.
func (rm *fairRoom) updates() []fair.Update {
	rm.calls++
	n := min(len(rm.leaving), fair.MaxUpdates)
	ups := make([]fair.Update, n, min(n+len(rm.dirty), fair.MaxUpdates))
	copy(ups, rm.leaving)
	rm.leaving = append(rm.leaving[:0], rm.leaving[n:]...)
	i := 0
	for ; i < len(rm.dirty) && len(ups) < fair.MaxUpdates; i++ {
		fq := rm.dirty[i]
		fq.dirty = false
		if fq.gone {
			continue
		}
		fq.sent, fq.held, fq.call = fq.update(), true, rm.calls
		ups = append(ups, fq.sent)
	}
	rm.dirty = append(rm.dirty[:0], rm.dirty[i:]...)
	return ups
}

// renewed makes every flow not sent in the last call dirty: the store
// knows only that call's registrations (it did not know this process, or
// the turns moved between the store and the room's own state).
func (rm *fairRoom) renewed() {
	for _, fq := range rm.flows {
		if fq.call != rm.calls {
			fq.held = false
			if !fq.dirty {
				fq.dirty = true
				rm.dirty = append(rm.dirty, fq)
			}
		}
	}
}

// span is how long cost units space key's slots: the slowest dimension's
// interval for its share of cost (at least 1 ms), on ctx's Costs.
func (s *Shaper) span(ctx context.Context, c *contract, cost int64) time.Duration {
	cs, _ := s.costsOf(ctx, c, "") // a bad Costs is refused by the reservation
	var d time.Duration
	for _, dm := range c.dims {
		n, _ := mapCost(cs, dm, "", cost)
		if dm.rate.Count > 0 && n > 0 {
			d = max(d, time.Duration(float64(dm.rate.Period)*float64(n)/float64(dm.rate.Count)))
		}
	}
	return max(d, time.Millisecond)
}

// burstSpan is how much of the key's schedule a burst may take at once:
// the most generous dimension's burst beyond its first unit.
func burstSpan(c *contract) time.Duration {
	var d time.Duration
	for _, dm := range c.dims {
		if dm.rate.Count > 0 && dm.rate.Burst > 1 {
			d = max(d, time.Duration(float64(dm.rate.Period)*float64(dm.rate.Burst-1)/float64(dm.rate.Count)))
		}
	}
	return d
}

// fair is Acquire for a request with a flow: it waits for the flow's turn,
// then sleeps until the slot it was granted.
func (s *Shaper) fair(ctx context.Context, key string, cost int64, f Flow) (Reservation, error) {
	if err := f.check(); err != nil {
		return Reservation{}, err
	}
	for {
		r, err := s.awaitTurn(ctx, key, cost, f)
		if err != nil || r.Delay <= 0 {
			return r, err
		}
		paused, err := s.sleepChecking(ctx, key, r)
		if err != nil {
			return Reservation{}, err
		}
		if !paused {
			return r, nil
		}
	}
}

// AwaitTurn waits for the turn of ctx's flow (see WithFlow; without one,
// the zero Flow's) among this key's waiting requests, and returns the
// reservation granted then, without sleeping until its slot, which is at
// most about one slot away per process sharing the key: the caller
// departs at its Time, or gives it back (Cancel). It is Acquire for a
// scheduler that holds the request meanwhile (the queue does). It refuses
// as Acquire does: at once with a *DeadlineError or *QueueFullError when
// the turn cannot come in time, with ctx.Err() when ctx ends while it
// waits. With an in-flight dimension it waits for its permit first, and
// the reservation holds it until Release.
func (s *Shaper) AwaitTurn(ctx context.Context, key string, cost int64) (Reservation, error) {
	if s == nil {
		return Reservation{}, errNilShaper
	}
	f, _ := FlowOf(ctx)
	if err := f.check(); err != nil {
		return Reservation{}, err
	}
	if s.flight != nil {
		return s.holding(ctx, key, cost, holdTurn)
	}
	return s.awaitTurn(ctx, key, cost, f)
}

// awaitTurn waits for f's turn on key and returns the reservation granted
// then, without sleeping until its slot.
func (s *Shaper) awaitTurn(ctx context.Context, key string, cost int64, f Flow) (Reservation, error) {
	c := s.live()
	if err := s.validate(ctx, c, key, cost); err != nil {
		return Reservation{}, err
	}
	w := &fairWaiter{ctx: ctx, cost: cost, weight: f.Weight, span: s.span(ctx, c, cost), out: make(chan fairResult, 1)}
	fr := &s.fairRooms
	fr.mu.Lock()
	rm := fr.rooms[key]
	if rm == nil {
		rm = &fairRoom{key: key, flows: map[flowKey]*flowQueue{}, classes: map[Priority]*classRoom{}, kick: make(chan struct{}, 1)}
	}
	if err := s.refuseAtOnce(ctx, c, rm, key, f, w); err != nil {
		fr.mu.Unlock()
		return Reservation{}, err
	}
	if fr.rooms == nil {
		fr.rooms = map[string]*fairRoom{}
	}
	if fr.rooms[key] == nil {
		if fr.opened++; fr.opened%256 == 0 {
			fr.sweep(s.cfg.clock.Now())
		}
		fr.rooms[key] = rm
	}
	if now := s.cfg.clock.Now(); !rm.running && rm.waiting == 0 && len(rm.leaving) == 0 && !rm.lead.After(now) {
		rm.running = true // nobody waits and no slot is held ahead: the request serves itself
		fr.mu.Unlock()
		return s.turnAlone(ctx, rm, f, w, now)
	}
	start := !rm.running
	rm.running = true
	fq := rm.join(f, w)
	fr.mu.Unlock()
	if start {
		go s.dispatch(rm)
	}
	return s.waitTurn(ctx, rm, fq, w)
}

// turns names rm's key's turns in the store.
func (s *Shaper) turns(rm *fairRoom) *store.Turns {
	s.fairRooms.mu.Lock()
	defer s.fairRooms.mu.Unlock()
	return &store.Turns{Base: s.cfg.prefix, Key: rm.key, Slot: s.slotOf(rm.key), Owner: s.fairRooms.ownerName()}
}

// turnAlone serves w, of flow f, alone in rm with no slot held ahead,
// without a dispatcher (rm.running is set for it): it asks for its own
// turn and reserves its slot, and hands rm to a dispatcher if requests
// arrived meanwhile. If another process's flow has the turn, it waits in
// rm as any request does.
func (s *Shaper) turnAlone(ctx context.Context, rm *fairRoom, f Flow, w *fairWaiter, now time.Time) (Reservation, error) {
	fr := &s.fairRooms
	t := s.turns(rm)
	fr.mu.Lock()
	rm.calls++
	fr.mu.Unlock()
	up := fair.Update{Name: f.Name, Priority: int(f.Priority), Weight: f.Weight, Cost: float64(w.cost), Last: true}
	ttl := min(max(8*w.span, 200*time.Millisecond), maxTurnTTL)
	reply, err := s.ask(rm, t, []fair.Update{up}, now, ttl, false) // returns holding fr.mu
	// An error: the key's turns hold data the store cannot use.
	if err != nil {
		if rm.waiting > 0 || len(rm.leaving) > 0 { // others came meanwhile
			fr.mu.Unlock()
			go s.dispatch(rm)
			return Reservation{}, err
		}
		s.closeRoom(rm)
		fr.mu.Unlock()
		return Reservation{}, err
	}
	if !reply.Granted || reply.Name != f.Name || Priority(reply.Priority) != f.Priority {
		if reply.Granted { // a registration this process had left there: it left
			rm.leaving = append(rm.leaving, fair.Update{Name: reply.Name, Priority: reply.Priority, Leave: true})
		}
		fq := rm.join(f, w)
		fq.held = true // the store holds the registration sent
		if fq.n == 1 { // as sent: the store need not hear it again
			if n := len(rm.dirty); n > 0 && rm.dirty[n-1] == fq {
				rm.dirty = rm.dirty[:n-1]
			}
			fq.dirty = false
			fq.sent, fq.call = up, rm.calls
		}
		fr.mu.Unlock()
		go s.dispatch(rm)
		return s.waitTurn(ctx, rm, fq, w)
	}
	fr.mu.Unlock()
	r, err := s.turnSlot(rm.key, w)
	fr.mu.Lock()
	if err == nil {
		rm.lead = r.Time()
	}
	if rm.waiting > 0 || len(rm.leaving) > 0 { // they came while it was served
		fr.mu.Unlock()
		go s.dispatch(rm)
		return r, err
	}
	s.closeRoom(rm)
	fr.mu.Unlock()
	return r, err
}

// closeRoom stops serving rm, and forgets it if no slot is held ahead.
// The caller holds fairRooms.mu.
func (s *Shaper) closeRoom(rm *fairRoom) {
	fr := &s.fairRooms
	rm.running = false
	if !rm.lead.After(s.cfg.clock.Now()) && fr.rooms[rm.key] == rm {
		delete(fr.rooms, rm.key)
	}
}

// waitTurn waits for the reservation rm's dispatcher grants w, of fq; if
// ctx ends first, w leaves (a slot granted as it left is given back).
func (s *Shaper) waitTurn(ctx context.Context, rm *fairRoom, fq *flowQueue, w *fairWaiter) (Reservation, error) {
	fr := &s.fairRooms
	select {
	case res := <-w.out:
		return res.r, res.err
	case <-ctx.Done():
	}
	fr.mu.Lock()
	w.left = true
	if !w.taken { // still queued: leave
		rm.take(fq, w)
		if rm.waiting == 0 {
			select {
			case rm.kick <- struct{}{}:
			default:
			}
		}
	}
	fr.mu.Unlock()
	select {
	case res := <-w.out: // granted as it left: give the slot back
		if res.err == nil {
			_ = res.r.Cancel(context.WithoutCancel(ctx))
		}
	default:
	}
	return Reservation{}, ctx.Err()
}

// refuseAtOnce refuses w, of flow f, when its slot, as this process sees
// the key, would come past ctx's deadline (a *DeadlineError) or MaxQueue
// (a *QueueFullError): after the slot the dispatcher holds, the slots of
// the requests that go before it here (ahead), then its own. The caller
// holds fairRooms.mu.
func (s *Shaper) refuseAtOnce(ctx context.Context, c *contract, rm *fairRoom, key string, f Flow, w *fairWaiter) error {
	now := s.cfg.clock.Now()
	// Behind a slot held ahead (the schedule is busy), the requests that go
	// first take the slots after it, then this one. With none held, they
	// take the slots from now on, the burst's at once: a lower bound, so
	// that nothing the reservation would grant is refused here.
	wait := rm.ahead(f, s.maxRun())
	if lead := rm.lead.Sub(now); lead > 0 {
		wait += lead + w.span
	} else {
		wait = max(wait-burstSpan(c), 0)
	}
	if dl, ok := ctx.Deadline(); ok && wait > dl.Sub(now) {
		return &DeadlineError{Key: key, Delay: wait, Deadline: dl}
	}
	if s.queues && wait > c.maxQueue {
		return &QueueFullError{Key: key, Delay: wait, MaxQueue: c.maxQueue}
	}
	return nil
}

// ahead is at least how long the requests waiting in rm that go before a
// request of f arriving now space the key, as this process sees it, under
// the rule against starvation with n = MaxPriorityRun: in f's class, the
// requests of f before it and the first request of each flow that starts
// at V (any other flow's start tag is ahead of V, and may be behind this
// request's); of the higher classes, all the requests waiting when n is 0,
// else at most n per turn of f's class before this one, at their mean span.
// Lower classes and other processes are not counted. O(classes).
func (rm *fairRoom) ahead(f Flow, n int) time.Duration {
	var d time.Duration
	turns := 1 // of f's class, this request's included
	fq := rm.flows[flowKey{f.Name, f.Priority}]
	if fq != nil {
		d += fq.spans
		turns += fq.n
	}
	if cr := rm.classes[f.Priority]; cr != nil {
		others, spans := cr.atV, cr.atVSpans
		if fq != nil && fq.pos < 0 {
			others, spans = others-1, spans-fq.headSpan
		}
		d += spans
		turns += others
	}
	higher, hspans := 0, time.Duration(0)
	for p, cr := range rm.classes {
		if p > f.Priority {
			higher += cr.requests
			hspans += cr.spans
		}
	}
	if higher > 0 {
		h := higher
		if n > 0 {
			h = min(higher, n*(turns-1))
		}
		d += time.Duration(float64(hspans) * float64(h) / float64(higher))
	}
	return d
}

// dispatch serves rm's turns while requests wait in it (see fairRoom).
func (s *Shaper) dispatch(rm *fairRoom) {
	fr := &s.fairRooms
	t := s.turns(rm)
	for {
		fr.mu.Lock()
		now := s.cfg.clock.Now()
		if rm.waiting == 0 && len(rm.leaving) > 0 { // tell the store before the room may close
			ups := rm.updates()
			fr.mu.Unlock()
			_, _ = s.ask(rm, t, ups, now, 0, true)
			fr.mu.Unlock()
			continue
		}
		if rm.waiting == 0 {
			s.closeRoom(rm)
			fr.mu.Unlock()
			return
		}
		span := rm.spans / time.Duration(rm.waiting)
		// Another process's flow had the turn lately: ask a slot ahead,
		// so that a turn passing between processes loses no slot.
		ahead := time.Duration(0)
		if now.Sub(rm.contended) < contention {
			ahead = span
		}
		hold := false
		if wake := rm.lead.Add(-ahead); wake.After(now) { // the slot held has not come
			if !rm.refresh.Before(wake) {
				fr.mu.Unlock()
				s.pauseDispatch(rm, wake)
				continue
			}
			if rm.refresh.After(now) { // it waits long: its registrations are kept alive meanwhile
				fr.mu.Unlock()
				s.pauseDispatch(rm, rm.refresh)
				continue
			}
			hold = true
		}
		ups := rm.updates()
		// The flows count as waiting in the store until this process asks
		// again: at its slot ahead, half a slot later when refused, or at
		// the latest half this TTL later.
		ttl := min(max(8*span, rm.lead.Sub(now)+4*span, 200*time.Millisecond), maxTurnTTL)
		fr.mu.Unlock()

		reply, err := s.ask(rm, t, ups, now, ttl, hold) // returns holding fr.mu
		if err != nil {                                 // the key's turns hold data the store cannot use: the oldest request fails with it
			if w, fq := rm.oldest(); w != nil {
				rm.take(fq, w)
				w.out <- fairResult{err: err}
			}
			fr.mu.Unlock()
			continue
		}
		var w *fairWaiter
		if reply.Granted {
			fq := rm.flows[flowKey{reply.Name, Priority(reply.Priority)}]
			if fq == nil && !slices.ContainsFunc(rm.leaving, func(u fair.Update) bool { return u.Name == reply.Name && u.Priority == reply.Priority }) {
				// A registration the store kept for a flow that left (told
				// to another store while this one failed): it leaves.
				rm.leaving = append(rm.leaving, fair.Update{Name: reply.Name, Priority: reply.Priority, Leave: true})
			}
			if fq != nil {
				if fq.sent.Last {
					fq.held = false // the store ended its registration
				}
				rm.unplace(fq)
				fq.finish = reply.Finish.Float()
				rm.place(fq)
				w = fq.first()
				rm.take(fq, w)
			}
		}
		fr.mu.Unlock()
		if w == nil {
			if !reply.Granted && !hold { // another process's flow has it: ask again soon
				s.pauseDispatch(rm, now.Add(min(span/2, ttl/2)))
			}
			continue
		}

		r, err := s.turnSlot(rm.key, w)
		fr.mu.Lock()
		left := w.left
		if !left {
			w.out <- fairResult{r: r, err: err}
			if err == nil {
				rm.lead = r.Time()
			}
		}
		fr.mu.Unlock()
		if left && err == nil { // it left as its turn came: the slot goes back
			_ = r.Cancel(context.WithoutCancel(w.ctx))
		}
	}
}

// oldest returns the request that has waited longest in rm, and its flow.
// O(flows): for the rare call that fails.
func (rm *fairRoom) oldest() (*fairWaiter, *flowQueue) {
	var best *fairWaiter
	var of *flowQueue
	for _, fq := range rm.flows {
		if w := fq.first(); w != nil && (best == nil || w.seq < best.seq) {
			best, of = w, fq
		}
	}
	return best, of
}

// ask asks the store for the next turn at now with ups, this process
// counting as waiting for ttl (hold: asking for none), and records V and
// contention in rm. While the store fails (down, or unhealthy), this
// process's flows take turns among themselves on the room's own state,
// and the reservation meets the failure policy; when either starts
// deciding after the other, it forgets what it held of this process and
// hears every flow again (Renewed). Data the store cannot use at the key
// fails the call (a *StateError on Redis), which the caller passes to a
// request. It returns holding fairRooms.mu.
func (s *Shaper) ask(rm *fairRoom, t *store.Turns, ups []fair.Update, now time.Time, ttl time.Duration, hold bool) (fair.Reply, error) {
	ctx := context.Background()
	p := fair.Params{Now: algorithms.Millis(now), TTL: algorithms.DurationMillis(ttl), MaxRun: s.maxRun(), Hold: hold}
	s.fairRooms.mu.Lock()
	onLocal := rm.onLocal
	s.fairRooms.mu.Unlock()
	q := p
	q.Fresh = onLocal
	st := startStore(ctx)
	reply, err := s.store.Turn(ctx, t, q, ups)
	st.done("turn", err)
	s.fairRooms.mu.Lock()
	rm.refresh = now.Add(ttl / 2)
	switch {
	case err == nil && onLocal:
		rm.onLocal, reply.Renewed = false, true
	case err != nil && errors.Is(err, ErrInvalidState):
		rm.onLocal = false
		rm.renewed()
		return fair.Reply{}, err
	case err != nil:
		if rm.local == nil {
			rm.local = &fair.State{}
		}
		q.Fresh = !onLocal
		reply = rm.local.Turn(q, t.Owner, ups)
		if !onLocal {
			rm.onLocal, reply.Renewed = true, true
		}
	}
	if reply.Renewed {
		rm.renewed()
	}
	if !reply.Granted && !hold {
		rm.contended = now
	}
	if reply.Granted {
		rm.setV(Priority(reply.Priority), reply.V.Float())
	}
	return reply, nil
}

// turnSlot reserves the slot of w, whose flow has the turn: with the leaky
// bucket at once (within its deadline), with the other algorithms once it
// is admitted (waitRetry).
func (s *Shaper) turnSlot(key string, w *fairWaiter) (Reservation, error) {
	if !s.queues {
		return s.waitRetry(w.ctx, key, w.cost)
	}
	limit := noLimit
	if dl, ok := w.ctx.Deadline(); ok {
		limit = algorithms.DurationMillis(time.Until(dl))
	}
	return s.reserve(w.ctx, key, w.cost, limit, false)
}

// pauseDispatch sleeps until t, or until rm empties.
func (s *Shaper) pauseDispatch(rm *fairRoom, t time.Time) {
	d := t.Sub(s.cfg.clock.Now())
	if d <= 0 {
		return
	}
	tm := s.cfg.clock.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C():
	case <-rm.kick:
	}
}

// maxRun is MaxPriorityRun in force.
func (s *Shaper) maxRun() int {
	if s.cfg.maxRunSet {
		return s.cfg.maxRun
	}
	return DefaultMaxPriorityRun
}
