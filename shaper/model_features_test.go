package shaper_test

// The model's ops for the capabilities threaded through the core: in-flight
// permits, fair turns among concurrent flows and classes, learning and
// spacing (model_learn_test.go), each with the oracle's rule for it.
//
// Concurrent requests are background calls (pend): an op spawns one or
// several blocking calls (Acquire with a flow, AwaitTurn, an Acquire that
// waits for a permit), each in its own goroutine, one after the other with
// the world settled in between (so their arrival order is the op order);
// they return during later ops, as the clock passes their slots. Every
// call carries trace hooks (internal/trace, the seam otelshaper uses) in
// its ctx: they tell the model, on the simulated clock and in one global
// order, when the call's permit was taken and released, and each
// reservation the store made for it, the turns of a fair dispatcher
// included.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/trace"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// ---- the configuration's features ----

// modelLease is the in-flight dimension's lease. redisstore renews leases
// on the real clock, every third of a lease: an hour is never reached
// within a run, so no renewal happens and every lease expires on the
// simulated clock at its take plus its lease (the documented exception of
// a holder that stopped renewing), which an advance across it shows.
const modelLease = time.Hour

// features is what a sequence draws for its configuration's capabilities.
type features struct {
	permits int           // InFlight (inflight configurations)
	maxRun  int           // WithMaxPriorityRun; -1: the default
	flows   []shaper.Flow // the flows the fair ops draw from
	learn   shaper.Learning
}

func drawFeatures(rng *rand.Rand, cfg modelCfg) features {
	f := features{permits: 1 + rng.IntN(3), maxRun: -1}
	switch rng.IntN(6) {
	case 0:
		f.maxRun = 0
	case 1:
		f.maxRun = 1 + rng.IntN(3)
	}
	n := 2 + rng.IntN(4)
	kind := rng.IntN(10)
	switch kind {
	case 0: // extreme weights (issue 37, defect 5)
		f.flows = []shaper.Flow{{Name: "w6", Weight: 1e6}, {Name: "w5", Weight: 1e5}, {Name: "wmin", Weight: shaper.MinWeight}}
	case 1: // more flows than a process puts forward (defect 2)
		for i := range 20 {
			f.flows = append(f.flows, shaper.Flow{Name: fmt.Sprintf("t%02d", i), Weight: 1})
		}
		f.flows = append(f.flows, shaper.Flow{Name: "batch", Weight: 1, Priority: shaper.Batch})
	case 2: // one tenant in two classes (defect 4)
		f.flows = []shaper.Flow{{Name: "acme", Weight: 1, Priority: shaper.Interactive}, {Name: "acme", Weight: 1, Priority: shaper.Batch}, {Name: "globex", Weight: 1}}
	default:
		weights := []float64{1, 1, 2, 3, 0.5}
		for i := range n {
			fl := shaper.Flow{Name: string(rune('a' + i)), Weight: weights[rng.IntN(len(weights))]}
			switch rng.IntN(5) {
			case 0:
				fl.Priority = shaper.Interactive
			case 1:
				fl.Priority = shaper.Batch
			}
			f.flows = append(f.flows, fl)
		}
	}
	floors := []shaper.Rate{{}, shaper.PerSecond(1), shaper.PerSecond(5)}
	starts := []shaper.Rate{{}, shaper.PerSecond(2), shaper.PerSecond(20)}
	f.learn = shaper.Learning{Floor: floors[rng.IntN(3)], Start: starts[rng.IntN(3)]}
	if rng.IntN(4) == 0 {
		f.learn.Memory = 10 * time.Minute
	}
	return f
}

func (m *mrun) featureOptions() []shaper.Option {
	var opts []shaper.Option
	if m.seq.feat.maxRun >= 0 {
		opts = append(opts, shaper.WithMaxPriorityRun(m.seq.feat.maxRun))
	}
	if m.cfg.learn {
		opts = append(opts, shaper.WithLearning(m.seq.feat.learn))
	}
	return opts
}

func (m *mrun) featureDims() []shaper.Dimension {
	if !m.cfg.inflight {
		return nil
	}
	return []shaper.Dimension{{Name: "open", InFlight: int64(m.seq.feat.permits), Lease: modelLease}}
}

// maxRun is the MaxPriorityRun in force.
func (m *mrun) maxRun() int {
	if m.seq.feat.maxRun >= 0 {
		return m.seq.feat.maxRun
	}
	return shaper.DefaultMaxPriorityRun
}

// ---- what the trace hooks tell ----

// callRec is what the trace hooks saw of one call (and the copies of its
// reservation): its permit, and the reservations the store made for it.
type callRec struct {
	permit     *permitRec
	reserves   []int64 // event order of each store reservation made for it
	reserveOps []int   // the op during which each was made
	turns      []int64 // event order of each fair turn asked for it
}

// permitRec is one permit held: from its take to its release, or (on
// Redis) its lease's expiry, whichever comes first.
type permitRec struct {
	sh       int
	key      string
	op       int // the op during which it was taken
	taken    time.Time
	takenSeq int64
	released time.Time
	relSeq   int64 // 0: not released
	lease    time.Duration
}

func (p *permitRec) String() string {
	s := fmt.Sprintf("permit of sh%d on %q taken at %s (op %d)", p.sh, p.key, p.taken.Format("15:04:05.000000"), p.op)
	if p.relSeq > 0 {
		s += " released at " + p.released.Format("15:04:05.000000")
	}
	return s
}

// callCtx returns parent with hooks that record the call into a new
// callRec, for shaper sh and key.
func (m *mrun) callCtx(parent context.Context, sh int, key string) (context.Context, *callRec) {
	rec := &callRec{}
	h := &trace.Hooks{
		StoreDone: func(_ context.Context, op string, _ time.Duration, err error) {
			switch op {
			case "reserve":
				if err == nil {
					m.mu.Lock()
					rec.reserves = append(rec.reserves, m.event())
					rec.reserveOps = append(rec.reserveOps, int(m.opNow.Load()))
					m.mu.Unlock()
				}
			case "turn":
				m.mu.Lock()
				rec.turns = append(rec.turns, m.event())
				m.mu.Unlock()
			}
		},
		PermitTaken: func(context.Context, time.Duration) {
			now := m.clock.Now()
			m.mu.Lock()
			defer m.mu.Unlock()
			p := &permitRec{sh: sh, key: key, op: int(m.opNow.Load()), taken: now, takenSeq: m.event(), lease: -1}
			if m.world.redis() {
				p.lease = modelLease
			}
			rec.permit = p
			m.permits = append(m.permits, p)
		},
		PermitReleased: func(context.Context) {
			now := m.clock.Now()
			m.mu.Lock()
			defer m.mu.Unlock()
			if p := rec.permit; p != nil && p.relSeq == 0 {
				p.released, p.relSeq = now, m.event()
			}
		},
	}
	return trace.With(parent, h), rec
}

// event returns the next number in the order of events (m.mu held).
func (m *mrun) event() int64 {
	m.events++
	return m.events
}

// ---- background calls ----

// pend is a blocking call running in the background.
type pend struct {
	id      int
	how     string // "fair" (Acquire with a flow), "turn" (AwaitTurn), "acquire"
	sh      int
	key     string
	cost    int64
	flow    shaper.Flow
	hasFlow bool
	op      int
	at      time.Time // spawned
	seq     int64     // the spawn's place in the order of events
	snap    snap      // what its shaper showed when it was spawned
	c       snap      // the contract it was spawned under
	cancel  context.CancelFunc
	done    chan struct{}
	rec     *callRec
	bg      bool // other background calls were on its key when it was spawned
	permits bool // its shaper has an in-flight dimension: it waits for a permit first

	r   shaper.Reservation
	err error
	ret time.Time // when it returned

	left      bool // a Leave op cancelled it
	leftSeq   int64
	collected bool
	dep       *departure
}

func (p *pend) String() string {
	s := fmt.Sprintf("%s#%d(sh%d %q cost %d", p.how, p.id, p.sh, p.key, p.cost)
	if p.hasFlow {
		s += fmt.Sprintf(" flow %q w%g p%d", p.flow.Name, p.flow.Weight, p.flow.Priority)
	}
	return s + ")"
}

// waitingForPermit: spawned, not returned, no permit taken (m.mu held).
func (p *pend) waitingForPermit() bool {
	if p.left || p.collected {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
	}
	return p.rec.permit == nil
}

// spawn starts a background call of how on shaper si and key.
func (m *mrun) spawn(how string, si int, key string, cost int64, flow *shaper.Flow) *pend {
	a := m.snap(si)
	ctx, cancel := context.WithCancel(context.Background())
	ctx, rec := m.callCtx(m.costCtx(ctx, cost), si, key)
	p := &pend{id: len(m.pending), how: how, sh: si, key: key, cost: cost, op: m.op, at: m.clock.Now(), snap: a, c: m.contractOf(si, a),
		cancel: cancel, done: make(chan struct{}), rec: rec, permits: m.cfg.inflight}
	for _, q := range m.pending {
		if q.key == key && !q.collected {
			p.bg = true
		}
	}
	if flow != nil {
		p.flow, p.hasFlow = *flow, true
		ctx = shaper.WithFlow(ctx, *flow)
	}
	m.mu.Lock()
	p.seq = m.event()
	m.mu.Unlock()
	m.pending = append(m.pending, p)
	s := m.sh[si]
	go func() {
		defer close(p.done)
		defer func() {
			if x := recover(); x != nil {
				m.fail("panic", "%v panicked: %v", p, x)
			}
		}()
		switch how {
		case "turn":
			p.r, p.err = s.AwaitTurn(ctx, key, cost)
		default:
			p.r, p.err = s.Acquire(ctx, key, cost)
		}
		p.ret = m.clock.Now()
	}()
	m.settle() // it arrives, and waits or returns, before anything else happens
	return p
}

// pendingOn reports whether a background call on key has not been
// collected: the bounds of the key (mkey) may lack its grant.
func (m *mrun) pendingOn(key string) bool {
	for _, p := range m.pending {
		if p.key == key && !p.collected {
			return true
		}
	}
	return false
}

// collect records the background calls that returned, in the order the
// store granted them (their last reservation's place in the order of
// events), and checks what each returned.
func (m *mrun) collect() {
	var ready []*pend
	for _, p := range m.pending {
		if p.collected {
			continue
		}
		select {
		case <-p.done:
			ready = append(ready, p)
		default:
		}
	}
	slices.SortFunc(ready, func(a, b *pend) int {
		return cmp.Or(cmp.Compare(lastOf(a.rec.reserves), lastOf(b.rec.reserves)), cmp.Compare(a.id, b.id))
	})
	for _, p := range ready {
		p.collected = true
		m.collectOne(p)
	}
	m.checkPermitWaiters()
}

func lastOf(s []int64) int64 {
	if len(s) == 0 {
		return math.MaxInt64
	}
	return s[len(s)-1]
}

func (m *mrun) collectOne(p *pend) {
	si, key := p.sh, p.key
	bs := m.snap(si)
	adm := m.admissible2(p.c, m.contractOf(si, bs), p.cost, false)
	ver, rates, certain := m.classifyBG(si, p.snap)
	if p.err != nil {
		m.logf("  %v spawned at op %d: %s at %s", p, p.op, errText(p.err), m.rel(p.ret))
		switch {
		case p.left && errors.Is(p.err, context.Canceled):
		case m.permitRefusal(p.err):
		default:
			if full := m.outcome(p.how, p.err, adm); full {
				m.refusedTurn(p)
			}
		}
		return
	}
	m.outcome(p.how, nil, adm)
	r := p.r
	if p.how != "turn" && p.ret.Before(r.Time()) {
		m.fail("time", "%v returned at %s, before its slot %s", p, m.rel(p.ret), m.rel(r.Time()))
	}
	n := r.Time().Add(-r.Delay)
	if n.Add(modelEps).Before(p.at) || n.After(p.ret.Add(modelEps)) {
		m.fail("time", "%v: its reservation counts its delay %v from %s, outside the call (%s to %s)", p, r.Delay, m.rel(n), m.rel(p.at), m.rel(p.ret))
	}
	d := m.newDep(si, key, p.how, r.Time(), p.cost, ver, rates)
	if ops := p.rec.reserveOps; len(ops) > 0 {
		d.op = ops[len(ops)-1] // the op during which the store granted it
		d.epoch = 0            // the key's Reset epoch then
		for _, r := range m.key(key).resets {
			if r < d.op {
				d.epoch++
			}
		}
	}
	p.dep = d
	m.checkWorkConserved(p, certain && ver >= 0)
	m.charge(m.key(key), rates, certain && ver >= 0, []*departure{d})
	m.hold(d, r, 1)
	m.logf("  %v spawned at op %d: slot %s (returned at %s) -> %v", p, p.op, m.rel(r.Time()), m.rel(p.ret), d)
}

// stopPending cancels every background call and drives the clock until
// they return (the run's end, or its close).
func (m *mrun) stopPending() {
	for _, p := range m.pending {
		p.cancel()
	}
	for _, p := range m.pending {
		if !m.clock.drive(p.done, m.clock.Now().Add(opHorizon)) {
			return // a hang: reported by finish
		}
	}
}

// ---- the ops ----

// doSpawn starts o.n background requests of one flow (fair ops), or plain
// Acquires (on a shaper with permits), one after another.
func (m *mrun) doSpawn(o mop) {
	si := m.shaperIdx(o)
	key := m.keys[o.key]
	c := m.contractOf(si, m.snap(si))
	cost := int64(1)
	if o.mode >= 12 {
		cost = m.costFor(o, c)
	}
	fl := m.seq.feat.flows[int(o.sel*float64(len(m.seq.feat.flows)))%len(m.seq.feat.flows)]
	how := "fair"
	switch {
	case o.mode%4 == 3:
		how = "turn"
	case o.mode%4 == 2 && m.cfg.inflight:
		how = "acquire"
	}
	n := max(o.n, 1)
	var ids []string
	for range n {
		var f *shaper.Flow
		if how != "acquire" {
			f = &fl
		}
		p := m.spawn(how, si, key, cost, f)
		ids = append(ids, fmt.Sprint(p.id))
		if m.hung {
			break
		}
	}
	what := how
	if how != "acquire" {
		what += fmt.Sprintf(" flow %q (w%g p%d)", fl.Name, fl.Weight, fl.Priority)
	}
	m.logf("Spawn sh%d %d x %s on %q cost %d: #%s", si, n, what, key, cost, strings.Join(ids, ",#"))
}

// doLeave cancels a background call still waiting (a request whose
// caller left).
func (m *mrun) doLeave(o mop) {
	var live []*pend
	for _, p := range m.pending {
		if !p.collected && !p.left {
			live = append(live, p)
		}
	}
	if len(live) == 0 {
		return
	}
	p := live[o.ref%len(live)]
	m.mu.Lock()
	p.left, p.leftSeq = true, m.event()
	m.mu.Unlock()
	// A grant given back as it leaves, or a slot it slept to, is not seen
	// by the model: the key's bounds no longer hold.
	m.key(p.key).fuzzy = true
	p.cancel()
	m.logf("Leave %v", p)
}

// permitWaitCap bounds an advance while requests wait for a permit.
const permitWaitCap = 30 * time.Second

// permitWaiters returns how many background calls wait for a permit.
func (m *mrun) permitWaiters() int {
	if !m.cfg.inflight {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, p := range m.pending {
		if p.waitingForPermit() {
			n++
		}
	}
	return n
}

// doDrain advances the clock, timer by timer, until no background call is
// left waiting, for at most two minutes of simulated time (30 s while one
// waits for a permit).
func (m *mrun) doDrain() {
	span := 2 * time.Minute
	if m.permitWaiters() > 0 {
		span = permitWaitCap
	}
	horizon := m.clock.Now().Add(span)
	for {
		var wait *pend
		for _, p := range m.pending {
			select {
			case <-p.done:
				continue
			default:
			}
			wait = p
			break
		}
		if wait == nil || !m.clock.drive(wait.done, horizon) {
			break
		}
	}
	m.logf("Drain: now %s", m.rel(m.clock.Now()))
}

// doRelease releases the permit of a reservation held, from one of its
// copies.
func (m *mrun) doRelease(o mop) {
	if len(m.handles) == 0 {
		return
	}
	h := m.handles[o.ref%len(m.handles)]
	j := o.cp % len(h.copies)
	err := h.copies[j].Release(m.ctx)
	m.logf("Release %v (copy %d): %s", h.dep, j, errText(err))
	if err != nil {
		m.fail("error", "Release of %v: %v", h.dep, err)
	}
}

// ---- permits: the oracle's rules ----

// holdsPermits checks what Wait and Allow return on a shaper with an
// in-flight dimension (a *ConfigError: their caller could not release),
// and reports whether err was that.
func (m *mrun) holdsPermits(what string, err error) bool {
	if !m.cfg.inflight {
		return false
	}
	var ce *shaper.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, shaper.ErrInvalidConfig) {
		m.fail("error", "%s on a shaper with an in-flight dimension: %s, want a *ConfigError (docs/INFLIGHT.md)", what, errText(err))
	}
	return true
}

// permitRefusal reports whether err is a refusal for want of a permit.
func (m *mrun) permitRefusal(err error) bool {
	var qf *shaper.QueueFullError
	return m.cfg.inflight && errors.As(err, &qf) && qf.InFlight
}

// heldUpper is how many permits of key may be held now, as far as the
// model knows (those taken and not released; a lease that may have expired
// counts: its holder may have renewed it). m.mu held.
func (m *mrun) heldUpper(key string) int {
	n := 0
	for _, p := range m.permits {
		if p.key == key && p.relSeq == 0 {
			n++
		}
	}
	return n
}

// reservePermit checks a Reserve refused for want of a permit (it never
// waits): with fewer than InFlight permits held and nobody of its process
// waiting for one, it had to be granted one.
func (m *mrun) reservePermit(si int, key string, err error) {
	m.mu.Lock()
	held := m.heldUpper(key)
	waiting := 0
	for _, p := range m.pending {
		if p.sh == si && p.key == key && p.waitingForPermit() {
			waiting++
		}
	}
	m.mu.Unlock()
	if held < m.seq.feat.permits && waiting == 0 {
		m.fail("permits", "Reserve on %q was refused for want of a permit (%s), though %d of %d are held and nobody of its process waits for one", key, errText(err), held, m.seq.feat.permits)
	}
}

// checkPermitWaiters: a request waiting for a permit while one is free is
// woken by the release notice at once, or at worst by its re-ask a second
// later (docs/INFLIGHT.md, "Waking"): a wait longer than that with a
// permit free is a lost wake-up.
func (m *mrun) checkPermitWaiters() {
	if !m.cfg.inflight {
		return
	}
	now := m.clock.Now()
	var msgs []string
	defer func() {
		for _, msg := range msgs {
			m.fail("permits", "%s", msg)
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, key := range m.keys {
		var waiter *pend
		for _, p := range m.pending {
			if p.key == key && p.waitingForPermit() {
				waiter = p
				break
			}
		}
		held := m.heldUpper(key)
		mk := m.key(key)
		if waiter == nil || held >= m.seq.feat.permits {
			mk.permitFree = time.Time{}
			continue
		}
		if mk.permitFree.IsZero() {
			mk.permitFree = now
			continue
		}
		if now.Sub(mk.permitFree) > time.Second+2*time.Millisecond {
			msgs = append(msgs, fmt.Sprintf("%v has waited for a permit of %q since %s while only %d of %d are held (free since %s at the latest)", waiter, key, m.rel(waiter.at), held, m.seq.feat.permits, m.rel(mk.permitFree)))
			mk.permitFree = now.Add(time.Hour) // once
		}
	}
}

// checkPermits (the run's end): at no instant more than InFlight permits of
// a key are held, each from its take until its release or, on Redis, its
// lease's expiry (its holder stopped renewing: the documented exception).
// At one instant, releases and expiries count before takes that come after
// them in the order of events; a take's hook runs after the store took it
// and a release's before the store releases, so the count is never more
// than the store's.
func (m *mrun) checkPermits() []finding {
	if !m.cfg.inflight {
		return nil
	}
	type ev struct {
		at    time.Time
		seq   int64
		delta int
		p     *permitRec
	}
	byKey := map[string][]ev{}
	for _, p := range m.permits {
		byKey[p.key] = append(byKey[p.key], ev{p.taken, p.takenSeq, +1, p})
		end, endSeq := time.Time{}, int64(0)
		if p.relSeq > 0 {
			end, endSeq = p.released, p.relSeq
		}
		if p.lease > 0 {
			if exp := p.taken.Add(p.lease); end.IsZero() || exp.Before(end) {
				end, endSeq = exp, math.MinInt64
			}
		}
		if !end.IsZero() {
			byKey[p.key] = append(byKey[p.key], ev{end, endSeq, -1, p})
		}
	}
	var out []finding
	for _, key := range m.keys {
		evs := byKey[key]
		slices.SortFunc(evs, func(a, b ev) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.seq, b.seq)) })
		held := map[*permitRec]bool{}
		for _, e := range evs {
			if e.delta < 0 {
				delete(held, e.p)
				continue
			}
			held[e.p] = true
			if len(held) > m.seq.feat.permits {
				var list []string
				for p := range held {
					list = append(list, p.String())
				}
				slices.Sort(list)
				out = append(out, finding{kind: "permits", msg: fmt.Sprintf("%d permits of %q held at %s, InFlight %d: %s", len(held), key, e.at.Format("15:04:05.000000"), m.seq.feat.permits, strings.Join(list, "; "))})
				break
			}
		}
	}
	return out
}

// ---- fair turns: the oracle's rules ----

// turn is one reservation a fair request's flow's turn granted.
type turn struct {
	seq  int64
	p    *pend
	last bool // the request's last reservation (its grant)
}

// fairTurns returns the turns granted on key, in order: the reservations
// the store made for fair requests.
func (m *mrun) fairTurns(key string) []turn {
	var ts []turn
	for _, p := range m.pending {
		if p.key != key || !p.hasFlow {
			continue
		}
		for i, s := range p.rec.reserves {
			ts = append(ts, turn{seq: s, p: p, last: i == len(p.rec.reserves)-1})
		}
	}
	slices.SortFunc(ts, func(a, b turn) int { return cmp.Compare(a.seq, b.seq) })
	return ts
}

// arrived is when p began to wait for its turn: its spawn, or with permits
// its permit's take (it waits for a permit first).
func (p *pend) arrived() int64 {
	if p.rec.permit != nil {
		return p.rec.permit.takenSeq
	}
	if p.permits {
		return math.MaxInt64 // it never had its permit: it never waited for a turn
	}
	return p.seq
}

// waitsAt reports whether p waited for a turn when the turn of order s
// was granted: it had arrived, and neither had its own last turn come
// before, nor had it left or returned.
func (p *pend) waitsAt(s int64) bool {
	if p.arrived() >= s {
		return false
	}
	if len(p.rec.reserves) > 0 {
		return lastOf(p.rec.reserves) >= s
	}
	if p.left {
		return p.leftSeq >= s
	}
	select {
	case <-p.done:
		return p.err == nil // refused at once, it never waited
	default:
		return true
	}
}

// fairJudged says whether the fair rules judge this run's turns: one
// process (the shares and classes are per process and key in a fleet,
// within a slot per process), and the leaky bucket (the other algorithms'
// turns retry with jitter).
func (m *mrun) fairJudged() bool { return !m.cfg.fleet && m.cfg.alg == "leaky" }

// class is a flow's identity for the shares: a flow's classes are separate
// flows (issue 37, defect 4).
type class struct {
	name string
	prio shaper.Priority
}

// checkFair (the run's end): on each key, in the order of its turns,
//   - shares: between two flows of one class both waiting over a run of
//     turns, the cost served divided by weight differs by at most
//     cmax/w1 + cmax/w2 (docs/FAIRNESS.md, start-time fair queuing's bound);
//   - the rule against starvation: while a flow of a lower class waits, at
//     most MaxPriorityRun turns in a row go to higher classes; with
//     MaxPriorityRun 0, no turn goes to a class while a higher one waits.
func (m *mrun) checkFair() []finding {
	if !m.fairJudged() {
		return nil
	}
	var out []finding
	for _, key := range m.keys {
		ts := m.fairTurns(key)
		if len(ts) < 2 {
			continue
		}
		var all []*pend
		for _, p := range m.pending {
			if p.key == key && p.hasFlow {
				all = append(all, p)
			}
		}
		if f := m.checkShares(key, ts, all); f != nil {
			out = append(out, *f)
		}
		if f := m.checkClasses(key, ts, all); f != nil {
			out = append(out, *f)
		}
	}
	return out
}

func (m *mrun) checkShares(key string, ts []turn, all []*pend) *finding {
	var flows []class
	weight := map[class]float64{}
	cmax := map[class]int64{}
	for _, p := range all {
		c := class{p.flow.Name, p.flow.Priority}
		if _, ok := weight[c]; !ok {
			flows = append(flows, c)
		}
		weight[c] = cmp.Or(p.flow.Weight, 1)
		cmax[c] = max(cmax[c], p.cost)
	}
	waits := func(c class, s int64) bool {
		for _, p := range all {
			if (class{p.flow.Name, p.flow.Priority}) == c && p.waitsAt(s) {
				return true
			}
		}
		return false
	}
	for i, a := range flows {
		for _, b := range flows[i+1:] {
			if a.prio != b.prio {
				continue
			}
			wa, wb := weight[a], weight[b]
			bound := float64(max(cmax[a], cmax[b]))/wa + float64(max(cmax[a], cmax[b]))/wb
			// The runs of turns at which both wait; in each, the prefix
			// sums of served/weight differences: the widest swing.
			var diff, lo, hi float64
			start := -1
			for k, t := range ts {
				if !waits(a, t.seq) || !waits(b, t.seq) {
					start = -1
					continue
				}
				if start < 0 {
					start, diff, lo, hi = k, 0, 0, 0
				}
				tc := class{t.p.flow.Name, t.p.flow.Priority}
				switch tc {
				case a:
					diff += float64(t.p.cost) / wa
				case b:
					diff -= float64(t.p.cost) / wb
				}
				lo, hi = min(lo, diff), max(hi, diff)
				if hi-lo > bound*(1+1e-9) {
					return &finding{kind: "fair", msg: fmt.Sprintf("key %q: flows %q (w%g) and %q (w%g) of class %d, both waiting from turn %d to turn %d, were served %.6g apart in cost/weight; start-time fair queuing bounds it by cmax/w1 + cmax/w2 = %.6g. Turns:\n%s",
						key, a.name, wa, b.name, wb, a.prio, start, k, hi-lo, bound, describeTurns(ts, start, k))}
				}
			}
		}
	}
	return nil
}

func (m *mrun) checkClasses(key string, ts []turn, all []*pend) *finding {
	n := m.maxRun()
	lowestWaiting := func(s int64) (shaper.Priority, bool) {
		var lo shaper.Priority
		found := false
		for _, p := range all {
			if p.waitsAt(s) && (!found || p.flow.Priority < lo) {
				lo, found = p.flow.Priority, true
			}
		}
		return lo, found
	}
	highestWaiting := func(s int64) (shaper.Priority, bool) {
		var hi shaper.Priority
		found := false
		for _, p := range all {
			if p.waitsAt(s) && (!found || p.flow.Priority > hi) {
				hi, found = p.flow.Priority, true
			}
		}
		return hi, found
	}
	run := 0 // turns in a row to the highest class waiting, while a lower one waits
	for k, t := range ts {
		prio := t.p.flow.Priority
		hi, _ := highestWaiting(t.seq)
		if n == 0 {
			if hi > prio {
				return &finding{kind: "fair", msg: fmt.Sprintf("key %q, MaxPriorityRun 0 (strict): turn %d went to class %d while class %d waited. Turns:\n%s", key, k, prio, hi, describeTurns(ts, max(0, k-5), k))}
			}
			continue
		}
		lo, _ := lowestWaiting(t.seq)
		if lo >= hi || prio < hi {
			run = 0 // nobody lower waits, or a lower class had its turn
			continue
		}
		run++
		if run > n {
			return &finding{kind: "fair", msg: fmt.Sprintf("key %q: %d turns in a row went to class %d while a flow of class %d waited; MaxPriorityRun is %d (docs/FAIRNESS.md: the lower classes keep at least 1/(n+1) of the turns between them). Turns:\n%s",
				key, run, hi, lo, n, describeTurns(ts, max(0, k-run), k))}
		}
	}
	return nil
}

func describeTurns(ts []turn, from, to int) string {
	var b strings.Builder
	for k := max(0, from); k <= to && k < len(ts); k++ {
		p := ts[k].p
		fmt.Fprintf(&b, "\t\tturn %d: %v", k, p)
		if p.dep != nil {
			fmt.Fprintf(&b, " slot %s", p.dep.at.Format("15:04:05.000000"))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// checkWorkConserved: in one process, a fair request's slot comes no later
// than the contract lets the key's next request go from the instant the
// turn before it came (or its own arrival, if later): a turn loses no slot
// while requests wait (docs/FAIRNESS.md, "Work conserving"). The bound is
// the key's (mkey.bound): what was granted and charged on it.
func (m *mrun) checkWorkConserved(p *pend, certain bool) {
	mk := m.key(p.key)
	if !m.fairJudged() || !p.hasFlow || !certain || mk.fuzzy || p.bg && mk.prevFair.IsZero() || m.grantedElsewhere(p) || p.dep.epoch != mk.epoch {
		if p.hasFlow {
			mk.prevFair = maxTime(mk.prevFair, p.r.Time())
		}
		return
	}
	from := maxTime(p.at, mk.prevFair)
	if p.rec.permit != nil {
		from = maxTime(from, p.rec.permit.taken)
	}
	mk.prevFair = maxTime(mk.prevFair, p.r.Time())
	b, ok := m.bound(mk, p.c, p.cost, from)
	if !ok || m.cfg.learn {
		return
	}
	if ratOf(p.r.Time()).Cmp(addRat(b, boundSlack)) > 0 {
		m.failDefect(m.lostSlotDefect(), "fair", "%v was granted the slot %s, %v after the contract let the key's next request go (%s, counted from %s, when the turn before it came or it arrived): a lone process lost a slot while requests waited (docs/FAIRNESS.md, \"Work conserving\")",
			p, m.rel(p.r.Time()), p.r.Time().Sub(timeOf(b)), m.rel(timeOf(b)), m.rel(from))
	}
}

// grantedElsewhere reports whether another background call on p's key was
// granted a slot it has not returned from: the key's bounds lack it.
func (m *mrun) grantedElsewhere(p *pend) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, q := range m.pending {
		if q != p && q.key == p.key && !q.collected && len(q.rec.reserves) > 0 {
			return true
		}
	}
	return false
}

// refusedTurn checks a fair request refused as full at once: by the rule
// against starvation, a request of the lowest class waiting, alone in its
// class, has its turn within MaxPriorityRun higher turns; when those
// turns' slots and its own come within MaxQueue, it had to wait, not be
// refused (issue 37, defect 1).
func (m *mrun) refusedTurn(p *pend) {
	n := m.maxRun()
	if !m.fairJudged() || !p.hasFlow || n == 0 || len(p.rec.reserves) > 0 || len(m.dims) != 1 || m.cfg.learn {
		return
	}
	mk := m.key(p.key)
	if mk.fuzzy || !mk.clean[0] || !mk.clampHi.IsZero() && !p.at.After(mk.clampHi) || !mk.pauseHi.IsZero() && p.at.Before(mk.pauseHi) {
		return
	}
	e := exactOf(p.c.rates[0])
	var higher []*big.Rat
	held := new(big.Rat) // the slots granted and not yet collected (the one held ahead)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, q := range m.pending {
		if q != p && q.key == p.key && !q.collected && len(q.rec.reserves) > 0 && lastOf(q.rec.reserves) < p.seq {
			held = addRat(held, e.tc(q.cost))
			continue
		}
		if q == p || q.key != p.key || !q.hasFlow || !q.waitsAt(p.seq) {
			continue
		}
		if q.flow.Priority <= p.flow.Priority {
			return // not alone in its class, or a lower one waits
		}
		higher = append(higher, e.tc(q.cost))
	}
	slices.SortFunc(higher, func(a, b *big.Rat) int { return b.Cmp(a) })
	// From the key's schedule: the earliest slot of a request of its cost,
	// after the slot held ahead and the n largest higher-class requests'
	// slots. (It was the slot of a request of cost 1 plus what its cost
	// spends past the burst: a cost of 2 within a burst of 2 came out a
	// whole interval early, cluster/leaky/1dim seed 22.)
	start, ok := m.bound(mk, p.c, p.cost, p.at)
	if !ok {
		return
	}
	wait := addRat(subRat(start, ratOf(p.at)), held)
	for i := 0; i < n && i < len(higher); i++ {
		wait = addRat(wait, higher[i])
	}
	if addRat(wait, big.NewRat(int64(time.Millisecond), 1)).Cmp(new(big.Rat).SetInt64(int64(p.c.mq))) <= 0 {
		m.mu.Unlock()
		defer m.mu.Lock()
		m.failDefect(1, "fair", "%v was refused at once (%s), though by the rule against starvation (MaxPriorityRun %d, %d higher-class requests waiting) its turn and slot come within %v, inside MaxQueue %v (docs/FAIRNESS.md)",
			p, errText(p.err), n, len(higher), durOf(wait), p.c.mq)
	}
}

// finish ends the run: the background calls still waiting leave, the
// clock runs until they have returned, and the end-of-run rules of the
// features are checked.
func (m *mrun) finish() {
	m.mu.Lock()
	for _, p := range m.pending {
		if !p.collected && !p.left {
			p.left, p.leftSeq = true, m.event()
		}
	}
	m.mu.Unlock()
	for _, p := range m.pending {
		p.cancel()
	}
	for _, p := range m.pending {
		if !m.clock.drive(p.done, m.clock.Now().Add(opHorizon)) {
			m.fail("hang", "%v did not return within %v of simulated time after its ctx was cancelled", p, opHorizon)
			m.hung = true
			return
		}
	}
	m.settle()
	m.collect()
	m.finds = append(m.finds, m.checkPermits()...)
	m.finds = append(m.finds, m.checkFair()...)
	m.finds = append(m.finds, m.checkLearned()...)
}

// lostSlotDefect: a lone process that loses slots with more flows waiting
// than it puts forward (16) is issue 37's defect 2.
func (m *mrun) lostSlotDefect() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	flows := map[class]bool{}
	for _, p := range m.pending {
		if p.hasFlow && !p.collected {
			flows[class{p.flow.Name, p.flow.Priority}] = true
		}
	}
	if len(flows) > 16 {
		return 2
	}
	return 0
}
