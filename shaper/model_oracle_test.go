package shaper_test

import (
	"cmp"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// The oracle of the model test. It shares no code with the library's
// kernels: it records every departure the library granted (its instant, its
// cost per dimension, the contract it was granted under, what was settled or
// cancelled on it) and replays them at the end with exact rational
// arithmetic (math/big) through the contracts' definitions in
// docs/GUARANTEES.md.
//
// modelEps is the tolerance of every comparison of instants: 1 µs. The
// library reads the clock as float64 milliseconds, a step of about 0.24 µs
// near 2026, and rounds each stored instant to that step; it may also place
// a slot that much early. The OS adds wake-up lateness on top, which is not
// modelled here (the test never sleeps in real time: slots are compared,
// not wake-ups). Anything cumulative larger than 1 µs is a defect.
const modelEps = time.Microsecond

var epsRat = big.NewRat(int64(modelEps), 1)

// ratOf returns t as exact nanoseconds since the Unix epoch.
func ratOf(t time.Time) *big.Rat { return new(big.Rat).SetInt64(t.UnixNano()) }

// timeOf is the inverse of ratOf, rounded down to the nanosecond (for messages).
func timeOf(r *big.Rat) time.Time {
	q := new(big.Int).Quo(r.Num(), r.Denom())
	return time.Unix(0, q.Int64())
}

// exactRate is a contract in exact terms: T = Period/Count ns per unit,
// tau = T*Burst.
type exactRate struct {
	rate  shaper.Rate
	T     *big.Rat
	tau   *big.Rat
	burst int64
}

func exactOf(r shaper.Rate) exactRate {
	b := r.Burst
	if b == 0 {
		b = 1
	}
	T := big.NewRat(int64(r.Period), r.Count)
	return exactRate{rate: r, T: T, tau: new(big.Rat).Mul(T, big.NewRat(b, 1)), burst: b}
}

// tc is T*c.
func (e exactRate) tc(c int64) *big.Rat { return new(big.Rat).Mul(e.T, new(big.Rat).SetInt64(c)) }

func maxRat(a, b *big.Rat) *big.Rat {
	if a == nil {
		return b
	}
	if b == nil || a.Cmp(b) >= 0 {
		return a
	}
	return b
}

func addRat(a, b *big.Rat) *big.Rat { return new(big.Rat).Add(a, b) }
func subRat(a, b *big.Rat) *big.Rat { return new(big.Rat).Sub(a, b) }

// durOf returns r (ns) as a Duration, rounded down (for messages).
func durOf(r *big.Rat) time.Duration {
	q := new(big.Int).Quo(r.Num(), r.Denom())
	if !q.IsInt64() {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(q.Int64())
}

// departure is one slot the library granted, as the oracle saw it.
type departure struct {
	id     int
	sh     int // the shaper that granted it
	key    string
	op     int // the op that granted it (several for a burst: the same)
	how    string
	at     time.Time
	caller int64   // the caller's cost
	cost   []int64 // per dimension, mapped (0: the dimension is left out)
	// rates is, per dimension, the contract in force when it was granted
	// (for a grant made while its shaper lagged a change: what that shaper
	// showed). ver is the oracle's version of the contract, -1 for a grant
	// made while its shaper lagged a change (or may have: see run.classify);
	// rateVer, per dimension, the version of that dimension's rate.
	rates   []shaper.Rate
	ver     int
	rateVer []int
	epoch   int // the key's Reset epoch
	episode int // the propagation episode it was granted in (-1: none)

	actual   []int64 // per dimension, once settled (nil: not settled)
	settleOp int
	settleLo time.Time // the clock just before the Settle call

	cancelled bool // cancelled before its slot: it never departs
	cancelOp  int
	unsure    bool // the cancel came too close to the slot to tell; counted as cancelled
	givenBack bool // settled or cancelled before its slot, by one of its copies
}

func (d *departure) String() string {
	s := fmt.Sprintf("dep#%d(op %d %s sh%d key %q at %s cost %v", d.id, d.op, d.how, d.sh, d.key, d.at.Format("15:04:05.000000000"), d.cost)
	if d.actual != nil {
		s += fmt.Sprintf(" settled %v at op %d", d.actual, d.settleOp)
	}
	if d.cancelled {
		s += fmt.Sprintf(" cancelled at op %d", d.cancelOp)
		if d.unsure {
			s += " (unsure)"
		}
	}
	if d.ver < 0 {
		s += " lagging"
	}
	return s + ")"
}

// pauseRec is a Pause (or a Clamp with remaining <= 0): nothing granted by
// a call made after op on key departs before endLo (the clock before the
// call, plus d).
type pauseRec struct {
	op    int
	key   string
	epoch int
	endLo time.Time
}

// clampRec is a Clamp that records a window: the requests granted by calls
// made after op and before until (a later clamp or Reset of the key) that
// depart before endLo are at least interval apart, and at most remaining.
type clampRec struct {
	op, until int
	key       string
	epoch     int
	endLo     time.Time
	interval  *big.Rat // ns
	remaining int64
	learning  bool   // set on a learning shaper, whose learned clamp may replace it (issue 37, defect 21)
	how       string // the op that set it: clamp, learn
}

// finding is one thing the model found wrong.
type finding struct {
	kind   string // conformance, ordering, fleet, pause, clamp, bound, status, error, panic, follow, rate, time, permits, fair, learn, space, hang
	msg    string
	defect int        // the defect of issue 37 the model attributes it to (0: none; see knownDefects)
	dep    *departure // the departure that broke a contract
}

func (f finding) String() string {
	if f.defect != 0 {
		return fmt.Sprintf("%s (issue 37, defect %d): %s", f.kind, f.defect, f.msg)
	}
	return f.kind + ": " + f.msg
}

// oracle holds what the library granted, and checks it.
type oracle struct {
	alg      string   // "leaky", "gcra", "token"
	dimNames []string // in the library's (name) order
	deps     []*departure
	pauses   []pauseRec
	clamps   []clampRec
	// episodes: per propagation episode, per dimension, every rate a
	// shaper of the fleet was under during it.
	episodes map[int][][]shaper.Rate
}

// verify runs every end-of-run check.
func (o *oracle) verify() []finding {
	var out []finding
	out = append(out, o.checkSegments()...)
	out = append(out, o.checkOrdering()...)
	out = append(out, o.checkPauses()...)
	out = append(out, o.checkClamps()...)
	out = append(out, o.checkFleet()...)
	return out
}

// byTime orders departures by instant, then grant order.
func byTime(a, b *departure) int {
	if c := a.at.Compare(b.at); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.op, b.op), cmp.Compare(a.id, b.id))
}

// finalCost is what d cost in dimension dim, as far as is known at the end.
func finalCost(d *departure, dim int) int64 {
	if d.actual != nil {
		return d.actual[dim]
	}
	return d.cost[dim]
}

// overran reports whether d was settled for more than it reserved in dim.
func overran(d *departure, dim int) bool { return d.actual != nil && d.actual[dim] > d.cost[dim] }

// viewCost is d's cost in dim as known when the departure j was granted:
// an overrun settled after that grant counts at the reserved cost (the
// library could not have made room for it); everything else as at the end
// (a give-back or a cancel, whenever it came, only lowers a replay).
func viewCost(d *departure, dim, grantOp int) int64 {
	if overran(d, dim) && d.settleOp > grantOp {
		return d.cost[dim]
	}
	return finalCost(d, dim)
}

// checkSegments: the departures granted under each contract (a key, a
// dimension, a Reset epoch, a version of the dimension's rate), replayed
// alone through it, conform to it. Those granted while a change propagated
// are checkFleet's. A step that breaks it is the library's
// fault unless an overrun settled after it was granted explains it: it must
// break the contract in the replay that counts those overruns at their
// reserved cost too (viewCost).
func (o *oracle) checkSegments() []finding {
	type segKey struct {
		key                 string
		dim, epoch, rateVer int
	}
	groups := map[segKey][]*departure{}
	var order []segKey
	for _, d := range o.deps {
		if d.ver < 0 || d.episode >= 0 || d.cancelled {
			continue // a change propagating: checkFleet's
		}
		for dim := range o.dimNames {
			if d.cost[dim] == 0 {
				continue
			}
			k := segKey{d.key, dim, d.epoch, d.rateVer[dim]}
			if _, ok := groups[k]; !ok {
				order = append(order, k)
			}
			groups[k] = append(groups[k], d)
		}
	}
	var out []finding
	for _, k := range order {
		deps := groups[k]
		slices.SortFunc(deps, byTime)
		rate := exactOf(deps[0].rates[k.dim])
		var f *finding
		if o.alg == "token" {
			f = o.tokenSegment(rate, deps, k.dim)
		} else {
			f = o.gcraSegment(rate, deps, k.dim)
		}
		if f != nil {
			f.msg = fmt.Sprintf("key %q dimension %q epoch %d under %v: %s", k.key, o.dimNames[k.dim], k.epoch, rate.rate, f.msg)
			if f.dep != nil && o.holeAfterOverrun(f.dep, k.dim) {
				f.defect = defectHoleAfterOverrun
			}
			out = append(out, *f)
			if len(out) >= 3 {
				break
			}
		}
	}
	return out
}

// gcraReplay replays deps[:upto+1] in time order through GCRA:
// R = max(R, t - ex) + T*c, ex = max(0, T*c - tau), and returns R after
// each step (nil for a step of cost 0) and the steps that leave R above
// t + tau + eps.
func gcraReplay(rate exactRate, deps []*departure, upto int, cost func(i int) int64) (Rs []*big.Rat, bad []int) {
	var R *big.Rat
	Rs = make([]*big.Rat, upto+1)
	for i := 0; i <= upto; i++ {
		c := cost(i)
		if c == 0 {
			continue
		}
		t := ratOf(deps[i].at)
		tc := rate.tc(c)
		ex := subRat(tc, rate.tau)
		if ex.Sign() < 0 {
			ex.SetInt64(0)
		}
		R = addRat(maxRat(R, subRat(t, ex)), tc)
		Rs[i] = R
		if R.Cmp(addRat(addRat(t, rate.tau), epsRat)) > 0 {
			bad = append(bad, i)
		}
	}
	return Rs, bad
}

// views groups the steps bad (indices into deps) by the knowledge view
// they are judged in: the overruns settled before their grant. It returns
// the groups in order, each with the grant op that defines its view.
func views(deps []*departure, dim int, bad []int) (groups [][]int, ops []int) {
	var settles []int
	for _, d := range deps {
		if overran(d, dim) {
			settles = append(settles, d.settleOp)
		}
	}
	slices.Sort(settles)
	byView := map[int]int{}
	for _, j := range bad {
		g := deps[j].op
		v, _ := slices.BinarySearch(settles, g) // how many overruns were settled before it
		i, ok := byView[v]
		if !ok {
			i = len(groups)
			byView[v] = i
			groups, ops = append(groups, nil), append(ops, g)
		}
		groups[i] = append(groups[i], j)
	}
	return groups, ops
}

func (o *oracle) gcraSegment(rate exactRate, deps []*departure, dim int) *finding {
	_, bad := gcraReplay(rate, deps, len(deps)-1, func(i int) int64 { return finalCost(deps[i], dim) })
	if len(bad) == 0 {
		return nil
	}
	groups, ops := views(deps, dim, bad)
	first := -1
	var found *finding
	for gi, group := range groups {
		g := ops[gi]
		last := group[len(group)-1]
		vRs, vbad := gcraReplay(rate, deps, last, func(i int) int64 { return viewCost(deps[i], dim, g) })
		for _, j := range group {
			if slices.Contains(vbad, j) { // not explained by an overrun settled after its grant
				if first < 0 || j < first {
					first, found = j, &finding{kind: "conformance", msg: describeGCRA(rate, deps, j, vRs, dim, g), dep: deps[j]}
				}
				break
			}
		}
	}
	return found
}

// describeGCRA says which step broke the contract, with the steps before it.
func describeGCRA(rate exactRate, deps []*departure, j int, Rs []*big.Rat, dim, grantOp int) string {
	var b strings.Builder
	t := ratOf(deps[j].at)
	over := subRat(Rs[j], addRat(t, rate.tau))
	fmt.Fprintf(&b, "the departure %v leaves R %v past t + tau (T %v, tau %v); the replay up to it:\n", deps[j], durOf(over), durOf(rate.T), durOf(rate.tau))
	for i := max(0, j-12); i <= j; i++ {
		if Rs[i] == nil {
			continue
		}
		fmt.Fprintf(&b, "\t\t%v cost %d: R - t = %v\n", deps[i], viewCost(deps[i], dim, grantOp), durOf(subRat(Rs[i], ratOf(deps[i].at))))
	}
	return b.String()
}

// tokEvent is a step of a token-bucket replay: a departure, or the extra
// of an overrun, charged at the instant it was settled.
type tokEvent struct {
	at    time.Time
	op    int
	c     int64
	dep   int // index into the segment's departures; -1 for an extra
	extra int // for an extra: the departure it belongs to
}

// checkToken replays a token-bucket segment: Burst tokens at first,
// refilled at Count per Period up to Burst; a departure needs c tokens
// (within eps of refill) and takes them; an overrun's extra is taken at
// its settle, never refused (docs: the other algorithms "charge an extra at
// the instant it is settled"). A settle for less gives nothing back.
func tokenReplay(rate exactRate, events []tokEvent, upto int) (bad []int, level []*big.Rat) {
	burst := new(big.Rat).SetInt64(rate.burst)
	tokens := new(big.Rat).Set(burst)
	var last *big.Rat
	epsTok := new(big.Rat).Quo(epsRat, rate.T)
	level = make([]*big.Rat, upto+1)
	for i := 0; i <= upto; i++ {
		e := events[i]
		t := ratOf(e.at)
		if last != nil && t.Cmp(last) > 0 {
			tokens = addRat(tokens, new(big.Rat).Quo(subRat(t, last), rate.T))
			if tokens.Cmp(burst) > 0 {
				tokens.Set(burst)
			}
		}
		last = maxRat(last, t)
		c := new(big.Rat).SetInt64(e.c)
		if e.dep >= 0 && addRat(tokens, epsTok).Cmp(c) < 0 {
			bad = append(bad, i)
		}
		level[i] = new(big.Rat).Set(tokens)
		tokens = subRat(tokens, c)
	}
	return bad, level
}

func (o *oracle) tokenSegment(rate exactRate, deps []*departure, dim int) *finding {
	build := func(grantOp int) []tokEvent {
		var ev []tokEvent
		for i, d := range deps {
			c := min(finalCost(d, dim), d.cost[dim])
			if c > 0 {
				ev = append(ev, tokEvent{at: d.at, op: d.op, c: c, dep: i})
			}
			if overran(d, dim) && d.settleOp < grantOp {
				ev = append(ev, tokEvent{at: d.settleLo, op: d.settleOp, c: d.actual[dim] - d.cost[dim], dep: -1, extra: i})
			}
		}
		slices.SortStableFunc(ev, func(a, b tokEvent) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.op, b.op)) })
		return ev
	}
	all := build(int(^uint(0) >> 1))
	if len(all) == 0 {
		return nil
	}
	badEv, _ := tokenReplay(rate, all, len(all)-1)
	var bad []int // departures' indices
	for _, i := range badEv {
		bad = append(bad, all[i].dep)
	}
	groups, ops := views(deps, dim, bad)
	var found *finding
	var foundAt time.Time
	for gi, group := range groups {
		ev := build(ops[gi])
		vbad, level := tokenReplay(rate, ev, len(ev)-1)
		for _, dj := range group {
			j := slices.IndexFunc(ev, func(e tokEvent) bool { return e.dep == dj })
			if !slices.Contains(vbad, j) {
				continue
			}
			d := deps[dj]
			if found != nil && !d.at.Before(foundAt) {
				break
			}
			var b strings.Builder
			fmt.Fprintf(&b, "the departure %v needs %d tokens and finds %s; the replay up to it:\n", d, ev[j].c, level[j].FloatString(3))
			for k := max(0, j-12); k <= j; k++ {
				e := ev[k]
				if e.dep >= 0 {
					fmt.Fprintf(&b, "\t\t%v takes %d of %s\n", deps[e.dep], e.c, level[k].FloatString(3))
				} else {
					fmt.Fprintf(&b, "\t\textra %d of %v at its settle %s, of %s\n", e.c, deps[e.extra], e.at.Format("15:04:05.000000000"), level[k].FloatString(3))
				}
			}
			found, foundAt = &finding{kind: "conformance", msg: b.String()}, d.at
			break
		}
	}
	return found
}

// holeAfterOverrun reports whether d was granted after an overrun was
// charged on its key and a give-back (a cancel before the slot: a hole; a
// settle for less) was made there too: the defect the model found (see
// knownDefects: the give-back does not count the overrun).
func (o *oracle) holeAfterOverrun(d *departure, dim int) bool {
	over, back := false, false
	for _, x := range o.deps {
		if x.key != d.key || x.epoch != d.epoch {
			continue
		}
		if overran(x, dim) && x.settleOp < d.op {
			over = true
		}
		if x.cancelled && x.cancelOp < d.op || x.actual != nil && x.actual[dim] < x.cost[dim] && x.settleOp < d.op {
			back = true
		}
	}
	return over && back
}

// checkOrdering: no departure granted under a later rate of a dimension
// departs before the latest departure granted before it under an earlier
// rate, on its key, still standing (not cancelled before the grant, not
// settled at 0) in the same Reset epoch (docs: "no slot granted after the change departs ahead
// of one granted before it"). Grants made while a change propagated (some
// shaper of the fleet had not followed it) are left to checkFleet: a
// lagging shaper reads the schedule in its own contract, and the fleet is
// then only promised the more generous of the two.
func (o *oracle) checkOrdering() []finding {
	type k struct {
		key        string
		dim, epoch int
	}
	groups := map[k][]*departure{}
	var order []k
	for _, d := range o.deps {
		if d.ver < 0 || d.episode >= 0 {
			continue
		}
		for dim := range o.dimNames {
			if d.cost[dim] == 0 {
				continue
			}
			gk := k{d.key, dim, d.epoch}
			if _, ok := groups[gk]; !ok {
				order = append(order, gk)
			}
			groups[gk] = append(groups[gk], d)
		}
	}
	var out []finding
	for _, gk := range order {
		deps := groups[gk]
		// A give-back (a settle for less, a cancel before the slot) lets
		// even one contract grant a later request a slot before an earlier
		// one: the refund makes room before it (docs/GUARANTEES.md, the
		// switch: "the instant the old contract would have let the next
		// unit go"). From the first give-back on the key the order is not
		// checked.
		gaveBack := math.MaxInt
		for _, d := range deps {
			if d.actual != nil && d.actual[gk.dim] < d.cost[gk.dim] {
				gaveBack = min(gaveBack, d.settleOp)
			}
			if d.cancelled {
				gaveBack = min(gaveBack, d.cancelOp)
			}
		}
		// Earlier rates first; within one, the latest departure first.
		before := map[int][]*departure{} // rateVer -> every departure under an earlier rate version
		var vers []int
		for _, d := range deps {
			if !slices.Contains(vers, d.rateVer[gk.dim]) {
				vers = append(vers, d.rateVer[gk.dim])
			}
		}
		slices.Sort(vers)
		for _, v := range vers[1:] {
			var prev []*departure
			for _, d := range deps {
				if d.rateVer[gk.dim] < v {
					prev = append(prev, d)
				}
			}
			slices.SortFunc(prev, func(a, b *departure) int { return -byTime(a, b) })
			before[v] = prev
		}
		for _, g := range deps {
			if g.op > gaveBack {
				continue
			}
			prev := before[g.rateVer[gk.dim]]
			for _, e := range prev {
				if e.op >= g.op || e.cancelled && e.cancelOp < g.op || finalCost(e, gk.dim) == 0 {
					continue // not standing, or it cost nothing: it bounds nothing
				}
				if g.at.Add(modelEps).Before(e.at) && !g.cancelled {
					out = append(out, finding{kind: "ordering", msg: fmt.Sprintf("key %q dimension %q: %v, granted under %v, departs %v ahead of %v, granted before it under %v",
						gk.key, o.dimNames[gk.dim], g, g.rates[gk.dim], e.at.Sub(g.at), e, e.rates[gk.dim])})
				}
				break // the latest one standing bounds it
			}
			if len(out) >= 3 {
				return out
			}
		}
	}
	return out
}

// checkPauses: nothing granted by a call made after a pause departs before
// it ends.
func (o *oracle) checkPauses() []finding {
	var out []finding
	for _, p := range o.pauses {
		for _, d := range o.deps {
			if d.key != p.key || d.op <= p.op || d.epoch != p.epoch || d.cancelled {
				continue
			}
			if d.at.Add(modelEps).Before(p.endLo) {
				out = append(out, finding{kind: "pause", msg: fmt.Sprintf("%v departs %v before the end of the pause of op %d (%s)", d, p.endLo.Sub(d.at), p.op, p.endLo.Format("15:04:05.000000000"))})
				if len(out) >= 3 {
					return out
				}
			}
		}
	}
	return out
}

// checkClamps: within a clamp's window, the requests granted after it
// depart at least reset/remaining apart, and at most remaining of them.
func (o *oracle) checkClamps() []finding {
	var out []finding
	for _, c := range o.clamps {
		var in []*departure
		for _, d := range o.deps {
			if d.key == c.key && d.op > c.op && d.op < c.until && d.epoch == c.epoch && !d.cancelled && d.at.Add(modelEps).Before(c.endLo) {
				in = append(in, d)
			}
		}
		defect := 0
		if c.learning {
			defect = 21 // the learned clamp, renewed, replaced the partner's
		}
		slices.SortFunc(in, byTime)
		if int64(len(in)) > c.remaining {
			out = append(out, finding{kind: "clamp", defect: defect, msg: fmt.Sprintf("the clamp of op %d (%s) left %d calls on key %q until %s, and %d depart before it: the last is %v", c.op, c.how, c.remaining, c.key, c.endLo.Format("15:04:05.000000000"), len(in), in[len(in)-1])})
		}
		for i := 1; i < len(in); i++ {
			gap := subRat(ratOf(in[i].at), ratOf(in[i-1].at))
			if addRat(gap, epsRat).Cmp(c.interval) < 0 {
				out = append(out, finding{kind: "clamp", defect: defect, msg: fmt.Sprintf("the clamp of op %d (%s) spaces key %q's calls %v apart, and %v departs %v after %v", c.op, c.how, c.key, durOf(c.interval), in[i], durOf(gap), in[i-1])})
				break
			}
		}
		if len(out) >= 3 {
			return out
		}
	}
	return out
}

// checkFleet: while a change propagates (some shaper of the fleet has not
// followed it), the departures granted meanwhile, by every shaper, stay in
// every window within the more generous of the contracts in play: for a
// window of length L opening at a departure of cost c1, at most
// max over those contracts of floor(L/T) + Burst + max(0, c1 - Burst)
// units (the last term: a cost above the burst is spread over the time
// before it). L is each contract's Period. Overruns count at their reserved
// cost (a call's extra cannot be refused).
func (o *oracle) checkFleet() []finding {
	type k struct {
		ep         int
		key        string
		dim, epoch int
	}
	groups := map[k][]*departure{}
	var order []k
	for _, d := range o.deps {
		if d.episode < 0 || d.cancelled {
			continue
		}
		for dim := range o.dimNames {
			if d.cost[dim] == 0 {
				continue
			}
			gk := k{d.episode, d.key, dim, d.epoch}
			if _, ok := groups[gk]; !ok {
				order = append(order, gk)
			}
			groups[gk] = append(groups[gk], d)
		}
	}
	var out []finding
	for _, gk := range order {
		deps := groups[gk]
		slices.SortFunc(deps, byTime)
		var rates []exactRate
		for _, r := range o.episodes[gk.ep][gk.dim] {
			rates = append(rates, exactOf(r))
		}
		for i, first := range deps {
			c1 := min(finalCost(first, gk.dim), first.cost[gk.dim])
			for _, lr := range rates {
				L := new(big.Rat).SetInt64(int64(lr.rate.Period))
				end := addRat(addRat(ratOf(first.at), L), epsRat)
				var sum int64
				last := i
				for j := i; j < len(deps) && ratOf(deps[j].at).Cmp(end) <= 0; j++ {
					sum += min(finalCost(deps[j], gk.dim), deps[j].cost[gk.dim])
					last = j
				}
				bound := int64(0)
				hiBurst, loBurst := int64(0), int64(math.MaxInt64)
				for _, r := range rates {
					n := new(big.Rat).Quo(addRat(L, epsRat), r.T)
					fl := new(big.Int).Quo(n.Num(), n.Denom()).Int64()
					bound = max(bound, fl+r.burst+max(0, c1-r.burst))
					hiBurst, loBurst = max(hiBurst, r.burst), min(loBurst, r.burst)
				}
				// A burst spent under the larger-burst contract is not
				// priced again by the other (docs/GUARANTEES.md, "Not
				// covered"): at most its difference more.
				bound += hiBurst - loBurst
				if sum > bound {
					var names []string
					for _, r := range rates {
						names = append(names, r.rate.String())
					}
					out = append(out, finding{kind: "fleet", msg: fmt.Sprintf("while a change propagated (episode %d), key %q dimension %q departed %d units in the %v from %v to %v; the more generous of %s allows %d",
						gk.ep, gk.key, o.dimNames[gk.dim], sum, lr.rate.Period, first, deps[last], strings.Join(names, " and "), bound)})
					break
				}
			}
			if len(out) > 0 {
				break
			}
		}
		if len(out) >= 3 {
			return out
		}
	}
	return out
}
