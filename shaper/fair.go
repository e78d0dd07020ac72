package shaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
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
	// Name identifies the flow among the flows of a key, fleet-wide ("" is a
	// flow too); at most MaxFlowName bytes.
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

// maxCands is how many of its flows a process puts forward for a turn at
// once: the first of each class, then the next in order.
const maxCands = 16

// contention is how long after a turn went to another process's flow the
// dispatcher keeps asking a slot ahead.
const contention = 10 * time.Second

// fairRooms holds, per key, the requests of this process waiting for
// their flow's turn.
type fairRooms struct {
	mu     sync.Mutex
	rooms  map[string]*fairRoom
	opened uint64 // rooms opened: every 256th sweeps the idle ones
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

// fairRoom is one key's waiting requests, by flow. Its dispatcher (one
// goroutine while any request waits) asks the store whose turn is next,
// reserves that flow's first request's slot, hands it over, and asks again
// once the slot has come: so at most one slot of the process runs ahead of
// the turns, and a request that arrives is at most that slot behind. The
// room outlives its dispatcher until that slot has come, so that requests
// arriving one at a time meanwhile wait in it too, where a later flow's
// request can go before them.
type fairRoom struct {
	key       string
	flows     map[string]*flowQueue
	waiting   int
	running   bool      // a dispatcher serves the room
	v         float64   // V, as the store last said
	lead      time.Time // the last slot the dispatcher reserved
	contended time.Time // when a turn last went to another process's flow
	seq       uint64    // orders flows first seen here
	leaving   []fair.Cand
	local     fair.State    // the turns taken while the store fails
	kick      chan struct{} // wakes the dispatcher (the room emptied)
}

// flowQueue is one flow's requests in a room, in arrival order.
type flowQueue struct {
	Flow
	finish float64 // its finish tag, as the store last said
	served float64 // its Seq, as the store last said (+Inf: never said)
	seq    uint64  // first seen here, among the flows of the room
	q      []*fairWaiter
	cost   int64         // the requests' costs, summed
	spans  time.Duration // their spans, summed
}

// push queues w last.
func (fq *flowQueue) push(w *fairWaiter) {
	fq.q = append(fq.q, w)
	fq.cost += w.cost
	fq.spans += w.span
}

// remove takes out the request at i.
func (fq *flowQueue) remove(i int) *fairWaiter {
	w := fq.q[i]
	fq.q = slices.Delete(fq.q, i, i+1)
	fq.cost -= w.cost
	fq.spans -= w.span
	return w
}

type fairWaiter struct {
	ctx  context.Context
	cost int64
	span time.Duration // how long its slot spaces the key (span)
	out  chan fairResult
	gone bool // under fairRooms.mu: its caller left
}

type fairResult struct {
	r   Reservation
	err error
}

// span is how long cost units space key's slots: the slowest dimension's
// interval for its share of cost (at least 1 ms).
func span(c *contract, cost int64) time.Duration {
	var d time.Duration
	for _, dm := range c.dims {
		n := cost
		if dm.cost != nil {
			n = dm.cost(cost)
		}
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
	w := &fairWaiter{ctx: ctx, cost: cost, span: span(c, cost), out: make(chan fairResult, 1)}
	fr := &s.fairRooms
	fr.mu.Lock()
	rm := fr.rooms[key]
	if rm == nil {
		rm = &fairRoom{key: key, flows: map[string]*flowQueue{}, kick: make(chan struct{}, 1)}
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

// join queues w, of flow f, in rm. The caller holds fairRooms.mu.
func (rm *fairRoom) join(f Flow, w *fairWaiter) *flowQueue {
	fq := rm.flows[f.Name]
	if fq == nil {
		rm.seq++
		fq = &flowQueue{Flow: f, finish: math.Inf(-1), served: math.Inf(1), seq: rm.seq}
		rm.flows[f.Name] = fq
	}
	fq.Weight, fq.Priority = f.Weight, f.Priority // the latest request's say
	fq.push(w)
	rm.waiting++
	return fq
}

// turnAlone serves w, of flow f, alone in rm with no slot held ahead,
// without a dispatcher (rm.running is set for it): it asks for its own
// turn and reserves its slot, and hands rm to a dispatcher if requests
// arrived meanwhile. If another process's flow has the turn, it waits in
// rm as any request does.
func (s *Shaper) turnAlone(ctx context.Context, rm *fairRoom, f Flow, w *fairWaiter, now time.Time) (Reservation, error) {
	fr := &s.fairRooms
	t := &store.Turns{Base: s.cfg.prefix, Key: rm.key, Slot: s.slotOf(rm.key)}
	cands := []fair.Cand{{Name: f.Name, Weight: f.Weight, Priority: int(f.Priority), Cost: float64(w.cost), Last: true}}
	reply := s.ask(rm, t, cands, 1, now, max(8*w.span, 200*time.Millisecond)) // returns holding fr.mu
	if reply.Granted != 0 {
		fq := rm.join(f, w)
		fq.finish, fq.served = reply.Finish[0], reply.Seq[0]
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
	rm.running = false
	if !rm.lead.After(s.cfg.clock.Now()) && fr.rooms[rm.key] == rm {
		delete(fr.rooms, rm.key)
	}
	fr.mu.Unlock()
	return r, err
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
	w.gone = true
	if i := slices.Index(fq.q, w); i >= 0 { // still queued: leave
		fq.remove(i)
		rm.waiting--
		rm.forgetIfEmpty(fq)
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

// order returns rm's flows in the order the store takes them (as far as
// this process knows their tags): higher priority, then the least start
// tag, then the least recently served. The caller holds fairRooms.mu.
func (rm *fairRoom) order() []*flowQueue {
	all := make([]*flowQueue, 0, len(rm.flows))
	for _, fq := range rm.flows {
		all = append(all, fq)
	}
	slices.SortFunc(all, func(a, b *flowQueue) int {
		if a.Priority != b.Priority {
			return cmp.Compare(b.Priority, a.Priority)
		}
		return cmp.Or(cmp.Compare(max(rm.v, a.finish), max(rm.v, b.finish)), cmp.Compare(a.served, b.served), cmp.Compare(a.seq, b.seq))
	})
	return all
}

// forgetIfEmpty drops fq once it has no request waiting: the store is told
// the flow left with the next call.
func (rm *fairRoom) forgetIfEmpty(fq *flowQueue) {
	if len(fq.q) > 0 {
		return
	}
	delete(rm.flows, fq.Name)
	rm.leaving = append(rm.leaving, fair.Cand{Name: fq.Name, Weight: fq.Weight, Priority: int(fq.Priority), Leave: true})
}

// refuseAtOnce refuses w, of flow f, when its slot, as this process sees
// the key, would come past ctx's deadline (a *DeadlineError) or MaxQueue
// (a *QueueFullError): after the slot the dispatcher holds, the slots of
// the requests that go before it here, then its own. The caller holds
// fairRooms.mu.
func (s *Shaper) refuseAtOnce(ctx context.Context, c *contract, rm *fairRoom, key string, f Flow, w *fairWaiter) error {
	now := s.cfg.clock.Now()
	// Behind a slot held ahead (the schedule is busy), the requests that go
	// first take the slots after it, then this one. With none held, they
	// take the slots from now on, the burst's at once: a lower bound, so
	// that nothing the reservation would grant is refused here.
	wait := rm.ahead(f)
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

// ahead is how long the requests waiting in rm that go before a request
// of f arriving now space the key: all those of higher classes and, in f's
// class, those whose start tags are below its own (lower classes and other
// processes are not counted).
func (rm *fairRoom) ahead(f Flow) time.Duration {
	tag := func(fq *flowQueue) float64 { return max(rm.v, fq.finish) }
	mine := rm.v
	if fq := rm.flows[f.Name]; fq != nil {
		mine = tag(fq) + float64(fq.cost)/f.Weight
	}
	var d time.Duration
	for name, fq := range rm.flows {
		switch {
		case fq.Priority < f.Priority:
			continue
		case fq.Priority > f.Priority || name == f.Name:
			d += fq.spans
			continue
		}
		t := tag(fq)
		for _, w := range fq.q {
			if t >= mine {
				break
			}
			d += w.span
			t += float64(w.cost) / fq.Weight
		}
	}
	return d
}

// candidates returns the flows rm puts forward for the next turn (of all,
// rm's flows in order), and the
// flows that left since the last call: the first flow of each class, the
// flow served least recently (the one the rule against starvation would
// pick), then the next ones in order, at most maxCands. The caller holds
// fairRooms.mu.
func (rm *fairRoom) candidates(all []*flowQueue) ([]fair.Cand, []*flowQueue) {
	picked := make([]*flowQueue, 0, min(len(all), maxCands))
	var oldest *flowQueue
	for i, fq := range all {
		if i == 0 || all[i-1].Priority != fq.Priority { // the first of each class
			if len(picked) < maxCands-1 {
				picked = append(picked, fq)
			}
		}
		if oldest == nil || fq.served < oldest.served {
			oldest = fq
		}
	}
	if !slices.Contains(picked, oldest) {
		picked = append(picked, oldest)
	}
	for _, fq := range all {
		if len(picked) >= maxCands {
			break
		}
		if !slices.Contains(picked, fq) {
			picked = append(picked, fq)
		}
	}
	cands := make([]fair.Cand, 0, len(picked)+len(rm.leaving))
	for _, fq := range picked {
		cands = append(cands, fair.Cand{Name: fq.Name, Weight: fq.Weight, Priority: int(fq.Priority), Cost: float64(fq.q[0].cost), Last: len(fq.q) == 1})
	}
	for _, c := range rm.leaving {
		if rm.flows[c.Name] == nil { // not back since it left
			cands = append(cands, c)
		}
	}
	rm.leaving = rm.leaving[:0]
	return cands, picked
}

// dispatch serves rm's turns while requests wait in it (see fairRoom).
func (s *Shaper) dispatch(rm *fairRoom) {
	fr := &s.fairRooms
	t := &store.Turns{Base: s.cfg.prefix, Key: rm.key, Slot: s.slotOf(rm.key)}
	ctx := context.Background()
	for {
		fr.mu.Lock()
		now := s.cfg.clock.Now()
		if rm.waiting == 0 && len(rm.leaving) > 0 { // tell the store before the room may close
			leaving := rm.leaving
			rm.leaving = nil
			fr.mu.Unlock()
			_, _ = s.store.Turn(ctx, t, fair.Params{Now: algorithms.Millis(now)}, leaving)
			continue
		}
		if rm.waiting == 0 {
			rm.running = false
			if !rm.lead.After(now) && fr.rooms[rm.key] == rm { // nothing held ahead: forget the room
				delete(fr.rooms, rm.key)
			}
			fr.mu.Unlock()
			return
		}
		all := rm.order()
		span := all[0].q[0].span
		// Another process's flow had the turn lately: ask a slot ahead,
		// so that a turn passing between processes loses no slot.
		ahead := time.Duration(0)
		if now.Sub(rm.contended) < contention {
			ahead = span
		}
		if wake := rm.lead.Add(-ahead); wake.After(now) { // the slot held has not come
			fr.mu.Unlock()
			s.pauseDispatch(rm, wake)
			continue
		}
		cands, picked := rm.candidates(all)
		// The flows count as waiting in the store until this process asks
		// again: after its slot ahead, or half a slot when refused.
		ttl := max(8*span, rm.lead.Sub(now)+4*span, 200*time.Millisecond)
		fr.mu.Unlock()

		reply := s.ask(rm, t, cands, len(picked), now, ttl) // returns holding fr.mu
		for i, fq := range picked {
			fq.finish, fq.served = reply.Finish[i], reply.Seq[i]
		}
		var w *fairWaiter
		if reply.Granted >= 0 && reply.Granted < len(picked) {
			fq := picked[reply.Granted]
			if len(fq.q) > 0 {
				w = fq.remove(0)
				rm.waiting--
				switch {
				case len(fq.q) > 0:
				case cands[reply.Granted].Last: // the store knows it stopped waiting
					delete(rm.flows, fq.Name)
				default: // its other requests left meanwhile: tell the store
					rm.forgetIfEmpty(fq)
				}
			}
		}
		fr.mu.Unlock()
		if w == nil {
			if reply.Granted < 0 { // another process's flow has it: ask again soon
				s.pauseDispatch(rm, now.Add(span/2))
			}
			continue
		}

		r, err := s.turnSlot(rm.key, w)
		fr.mu.Lock()
		gone := w.gone
		if !gone {
			w.out <- fairResult{r: r, err: err}
			if err == nil {
				rm.lead = r.Time()
			}
		}
		fr.mu.Unlock()
		if gone && err == nil { // it left as its turn came: the slot goes back
			_ = r.Cancel(context.WithoutCancel(w.ctx))
		}
	}
}

// ask asks the store for the next turn among cands (n flows waiting, then
// the ones leaving) at now, the waiting ones counting as such for ttl,
// and records V and contention in rm. While the store fails (down, or its
// data unusable), this process's flows take turns among themselves on the
// room's own state, and the reservation meets the failure policy; the
// flows that left are told once the store answers again. It returns
// holding fairRooms.mu.
func (s *Shaper) ask(rm *fairRoom, t *store.Turns, cands []fair.Cand, n int, now time.Time, ttl time.Duration) fair.Reply {
	ctx := context.Background()
	p := fair.Params{Now: algorithms.Millis(now), TTL: algorithms.DurationMillis(ttl), MaxRun: s.maxRun()}
	st := startStore(ctx)
	reply, err := s.store.Turn(ctx, t, p, cands)
	st.done("turn", err)
	s.fairRooms.mu.Lock()
	if err != nil {
		reply = rm.local.Turn(p, cands)
		rm.leaving = append(rm.leaving, cands[n:]...)
	}
	if reply.Granted < 0 {
		rm.contended = now
	}
	rm.v = reply.V
	return reply
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
