package fair

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// naive is the rule of the package comment written as plainly as it
// reads, with a scan of every flow per decision: the reference State's
// indexed orders must reproduce, reply for reply.
type naive struct {
	vs     map[int]Tag // per class
	N, Run float64
	flows  map[flowID]*nflow
	owners map[string]float64 // until
}

type nflow struct {
	F    Tag
	seq  float64
	regs map[string]reg // by owner (reg.owner unused)
}

func (m *naive) reset() {
	*m = naive{vs: map[int]Tag{}, flows: map[flowID]*nflow{}, owners: map[string]float64{}}
}

// parkedOf returns the flows no owner waits for, of class c (any when all).
func (m *naive) parkedOf(c int, all bool) []flowID {
	var ids []flowID
	for id, f := range m.flows {
		if len(f.regs) == 0 && (all || id.class == c) {
			ids = append(ids, id)
		}
	}
	return ids
}

func (m *naive) unwait(id flowID) {
	f := m.flows[id]
	if len(f.regs) > 0 {
		return
	}
	if !m.vs[id.class].Less(f.F) {
		delete(m.flows, id)
		return
	}
	if len(m.parkedOf(0, true)) > maxParked {
		delete(m.flows, slices.MinFunc(m.parkedOf(id.class, false), func(a, b flowID) int {
			fa, fb := m.flows[a].F, m.flows[b].F
			switch {
			case fa.Less(fb):
				return -1
			case fb.Less(fa):
				return 1
			case a.member() < b.member():
				return -1
			}
			return 1
		}))
	}
}

func (m *naive) dropRegs(who string) {
	var ids []flowID
	for id, f := range m.flows {
		if _, ok := f.regs[who]; ok {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b flowID) int { return strings.Compare(a.member(), b.member()) })
	for _, id := range ids {
		delete(m.flows[id].regs, who)
		m.unwait(id)
	}
}

func (m *naive) waits(who string) bool {
	for _, f := range m.flows {
		if _, ok := f.regs[who]; ok {
			return true
		}
	}
	return false
}

func (m *naive) turn(p Params, who string, ups []Update) Reply {
	if m.flows == nil {
		m.reset()
	}
	var gone []string
	for o, until := range m.owners {
		if until < p.Now {
			gone = append(gone, o)
		}
	}
	slices.SortFunc(gone, func(a, b string) int {
		if m.owners[a] != m.owners[b] {
			return cmp.Compare(m.owners[a], m.owners[b])
		}
		return strings.Compare(a, b)
	})
	for _, o := range gone {
		m.dropRegs(o)
		delete(m.owners, o)
	}
	if len(m.owners) == 0 {
		m.reset()
	}
	_, known := m.owners[who]
	reply := Reply{Renewed: !known}
	if known && p.Fresh {
		m.dropRegs(who)
	}
	for _, u := range ups {
		id := flowID{u.Priority, u.Name}
		f := m.flows[id]
		if u.Leave {
			if f != nil {
				if _, ok := f.regs[who]; ok {
					delete(f.regs, who)
					m.unwait(id)
				}
			}
			continue
		}
		if f == nil {
			m.N++
			f = &nflow{seq: m.N, regs: map[string]reg{}}
			m.flows[id] = f
		}
		f.regs[who] = reg{cost: u.Cost, weight: u.Weight, last: u.Last}
	}
	if !m.waits(who) {
		delete(m.owners, who)
		return reply
	}
	m.owners[who] = p.Now + p.TTL
	if !p.Hold {
		m.grant(p, who, &reply)
	}
	return reply
}

func (m *naive) grant(p Params, who string, reply *Reply) {
	var best flowID
	var bf *nflow
	before := func(id flowID, f *nflow) bool {
		if id.class != best.class {
			return id.class > best.class
		}
		v := m.vs[id.class]
		sa, sb := v.Max(f.F), v.Max(bf.F)
		if sa != sb {
			return sa.Less(sb)
		}
		return f.seq < bf.seq
	}
	for id, f := range m.flows {
		if len(f.regs) > 0 && (bf == nil || before(id, f)) {
			best, bf = id, f
		}
	}
	starved := false
	if p.MaxRun > 0 && m.Run >= float64(p.MaxRun) {
		var low flowID
		var lf *nflow
		for id, f := range m.flows {
			if len(f.regs) > 0 && id.class < best.class && (lf == nil || f.seq < lf.seq) {
				low, lf = id, f
			}
		}
		if lf != nil {
			best, bf, starved = low, lf, true
		}
	}
	r, ok := bf.regs[who]
	if !ok {
		return
	}
	st := m.vs[best.class].Max(bf.F)
	bf.F = st.Add(r.cost / r.weight)
	m.vs[best.class] = st
	m.N++
	bf.seq = m.N
	for _, id := range m.parkedOf(best.class, false) {
		if !st.Less(m.flows[id].F) {
			delete(m.flows, id)
		}
	}
	lower := false
	for id, f := range m.flows {
		if len(f.regs) > 0 && id.class < best.class {
			lower = true
		}
	}
	if starved || !lower {
		m.Run = 0
	} else {
		m.Run++
	}
	reply.Granted, reply.Name, reply.Priority, reply.Start, reply.Finish, reply.V = true, best.name, best.class, st, bf.F, st
	if r.last {
		delete(bf.regs, who)
		m.unwait(best)
		if !m.waits(who) {
			delete(m.owners, who)
		}
	}
}

// randomCall draws one call from rng: an owner of owners, updates of flows
// of a few names in three classes (and the extreme ones), the bounds among
// weights and costs, leaving and last, hold and fresh now and then; time
// moves on, past the TTLs at times.
func randomCall(rng *rand.Rand, now *float64, owners []string, names int) (Params, string, []Update) {
	*now += float64(rng.IntN(30))
	if rng.IntN(40) == 0 {
		*now += 1000
	}
	p := Params{Now: *now, TTL: float64(20 + rng.IntN(200)), MaxRun: rng.IntN(4), Fresh: rng.IntN(30) == 0, Hold: rng.IntN(20) == 0}
	who := owners[rng.IntN(len(owners))]
	var ups []Update
	seen := map[flowID]bool{}
	for range rng.IntN(5) {
		id := flowID{rng.IntN(3) - 1, fmt.Sprint("f", rng.IntN(names))}
		if rng.IntN(30) == 0 {
			id.class = []int{-100, 100}[rng.IntN(2)]
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		ups = append(ups, Update{
			Name: id.name, Priority: id.class,
			Weight: []float64{1, 2, 0.5, 3, minWeight, maxWeight, 1e5}[rng.IntN(7)],
			Cost:   []float64{1, 2, 3, 0, 10000}[rng.IntN(5)],
			Last:   rng.IntN(5) == 0,
			Leave:  rng.IntN(6) == 0,
		})
	}
	return p, who, ups
}

// The indexed State grants what the plain reading of the rule grants, call
// for call, on random sequences of owners, flows, classes, weights, costs,
// leaves, expiries, holds and fresh starts: the same replies (tags bit for
// bit) and the same flows kept. With the park's bound lowered to 3, its
// evictions too.
func TestStateFollowsTheRule(t *testing.T) {
	t.Cleanup(func() { maxParked = MaxParked })
	for _, parked := range []int{MaxParked, 3} {
		maxParked = parked
		for seed := range uint64(60) {
			rng := rand.New(rand.NewPCG(seed, 1))
			var s State
			var m naive
			now := 0.0
			for step := range 600 {
				p, who, ups := randomCall(rng, &now, []string{"a", "b", "c"}, 6)
				got, want := s.Turn(p, who, ups), m.turn(p, who, ups)
				if fmt.Sprint(got) != fmt.Sprint(want) || s.Flows() != len(m.flows) {
					t.Fatalf("park %d, seed %d, step %d: %s %+v %+v\n got  %+v (%d flows)\n want %+v (%d flows)", parked, seed, step, who, p, ups, got, s.Flows(), want, len(m.flows))
				}
			}
		}
	}
	maxParked = MaxParked
}

// FuzzTurn is TestStateFollowsTheRule on sequences the fuzzer draws.
func FuzzTurn(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	f.Add([]byte{0xff, 0, 0x80, 3, 9, 27, 81, 243, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		var s State
		var m naive
		now := 0.0
		for len(data) >= 4 {
			op, x, y, z := data[0], data[1], data[2], data[3]
			data = data[4:]
			now += float64(x % 40)
			p := Params{Now: now, TTL: float64(10 + y%90), MaxRun: int(op % 4), Fresh: z&0x80 != 0 && op&0x40 != 0, Hold: z&0x40 != 0 && op&0x20 != 0}
			who := []string{"a", "b"}[z&1]
			var ups []Update
			for i := range 4 {
				if x>>i&1 == 0 {
					continue
				}
				ups = append(ups, Update{Name: fmt.Sprint(i % 3), Priority: i/3 - int(y>>i&1),
					Weight: []float64{1, 2, 0.5, 3, minWeight, maxWeight}[(int(y)+i)%6], Cost: []float64{1, 2, 0, 10000}[(int(z)+i)%4],
					Last: z>>(2+i)&1 == 1, Leave: op>>(4+i%4)&3 == 3})
			}
			slices.SortFunc(ups, func(a, b Update) int { return cmpID(a, b) })
			ups = slices.CompactFunc(ups, func(a, b Update) bool { return cmpID(a, b) == 0 })
			got, want := s.Turn(p, who, ups), m.turn(p, who, ups)
			if fmt.Sprint(got) != fmt.Sprint(want) || s.Flows() != len(m.flows) {
				t.Fatalf("%s %+v %+v\n got  %+v\n want %+v", who, p, ups, got, want)
			}
		}
	})
}

func cmpID(a, b Update) int {
	if a.Priority != b.Priority {
		return a.Priority - b.Priority
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}

// backlog asks for n turns as one owner with every flow of flows waiting
// (each registered anew with the cost cost(turn, flow) of its next
// request), and returns the cost served per flow, checking after each turn
// that the flows of the highest class are within SFQ's bound:
// |W_i/w_i - W_j/w_j| <= cmax/w_i + cmax/w_j, at every step (the service
// counted only while both wait, as here). (The lower classes' turns that
// the rule against starvation gives go by least recent service, not by
// weight.)
func backlog(t *testing.T, s *State, p *Params, flows []Update, n int, cost func(turn, flow int) float64) map[flowID]float64 {
	t.Helper()
	served := map[flowID]float64{}
	cmax := 0.0
	top := -1 << 31
	for _, f := range flows {
		top = max(top, f.Priority)
	}
	for i := range n {
		ups := make([]Update, len(flows))
		for j, f := range flows {
			f.Cost = cost(i, j)
			cmax = max(cmax, f.Cost)
			ups[j] = f
		}
		r := s.Turn(*p, "one", ups)
		if !r.Granted {
			t.Fatalf("turn %d: an owner alone, with every flow waiting, was refused", i)
		}
		for j, f := range ups {
			if f.Name == r.Name && f.Priority == r.Priority {
				served[flowID{f.Priority, f.Name}] += ups[j].Cost
			}
		}
		p.Now++
		for _, a := range flows {
			for _, b := range flows {
				if a.Priority != top || b.Priority != top {
					continue
				}
				wa, wb := served[flowID{a.Priority, a.Name}]/a.Weight, served[flowID{b.Priority, b.Name}]/b.Weight
				if d, bound := math.Abs(wa-wb), cmax/a.Weight+cmax/b.Weight; d > bound*(1+1e-12) {
					t.Fatalf("turn %d: %s and %s apart by %v, bound %v (%v)", i, a.Name, b.Name, d, bound, served)
				}
			}
		}
	}
	return served
}

// Flows that stay backlogged receive service in proportion to their
// weights, within SFQ's bound at every step, whatever their weights and
// costs: random flows of one class, weights across [minWeight, maxWeight],
// costs from 1 to 10,000, after the key's V has grown (the class this
// bound belongs to).
func TestSharesFollowWeightsWithinTheBound(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 2))
		var s State
		p := &Params{Now: 1, TTL: 10}
		// V grows first: a minWeight flow of cost 10,000, served twice.
		backlog(t, &s, p, []Update{{Name: "heavy", Weight: minWeight}}, 2+rng.IntN(3), func(int, int) float64 { return 10000 })
		var flows []Update
		for i := range 2 + rng.IntN(4) {
			w := math.Pow(10, -6+12*rng.Float64())
			flows = append(flows, Update{Name: fmt.Sprint("f", i), Weight: w})
		}
		costs := []float64{1, float64(1 + rng.IntN(100)), float64(1 + rng.IntN(10000))}
		backlog(t, &s, p, flows, 3000, func(turn, flow int) float64 { return costs[(turn*7+flow*3)%len(costs)] })
	}
}

// Weights 1e6 and 1e5 split 10:1, within the bound, after a minWeight flow
// of cost 10,000 ran and moved V to 1e10 and 2e10: with float64 tags the
// 1e-6 steps of the first were rounded to the key's ulp (183:37, then
// 219:1, issue 37).
func TestExtremeWeightsKeepTheirShares(t *testing.T) {
	for runs := 2; runs <= 3; runs++ {
		var s State
		p := &Params{Now: 1, TTL: 10}
		backlog(t, &s, p, []Update{{Name: "min", Weight: minWeight}}, runs, func(int, int) float64 { return 10000 })
		if s.V(0).Float() < 1e10 {
			t.Fatalf("V %v: the heavy flow did not move it", s.V(0))
		}
		got := backlog(t, &s, p, []Update{{Name: "big", Weight: 1e6}, {Name: "small", Weight: 1e5}}, 1100, func(int, int) float64 { return 1 })
		if b, sm := got[flowID{0, "big"}], got[flowID{0, "small"}]; math.Abs(b-10*sm) > 11 {
			t.Fatalf("V at %v: big %v, small %v: want 10:1 within 11", s.V(0), b, sm)
		}
	}
}

// A flow that arrives starts at V: its first request goes before the
// second of a flow that was waiting, whatever that flow's backlog.
func TestALateFlowStartsAtV(t *testing.T) {
	var s State
	p := &Params{Now: 1, TTL: 10}
	backlog(t, &s, p, []Update{{Name: "a", Weight: 1}}, 1000, func(int, int) float64 { return 1 })
	order := ""
	for range 6 {
		r := s.Turn(*p, "one", []Update{{Name: "a", Weight: 1, Cost: 1}, {Name: "b", Weight: 1, Cost: 1}})
		order += r.Name
		p.Now++
	}
	if order != "bababa" {
		t.Fatalf("turns %q, want b first, then alternating", order)
	}
}

// A higher class goes first; with MaxRun n a lower class waiting gets one
// turn in n+1; with MaxRun 0 it waits while the higher class waits.
func TestPriorityAndTheRuleAgainstStarvation(t *testing.T) {
	for _, maxRun := range []int{0, 1, 4, 9} {
		var s State
		p := &Params{Now: 1, TTL: 10, MaxRun: maxRun}
		got := backlog(t, &s, p, []Update{{Name: "batch", Weight: 100, Priority: -1}, {Name: "chat", Weight: 1, Priority: 1}}, 1000, func(int, int) float64 { return 1 })
		want := 0.0
		if maxRun > 0 {
			want = 1000 / float64(maxRun+1)
		}
		if math.Abs(got[flowID{-1, "batch"}]-want) > 1 {
			t.Fatalf("MaxRun %d: batch served %v of 1000, want %v", maxRun, got[flowID{-1, "batch"}], want)
		}
	}
}

// With three classes waiting, the lower two share the turns the rule
// against starvation gives: neither starves behind the other. And random
// sets of flows in random classes: while a lower class waits, the lower
// classes together get at least floor(turns/(n+1)) of the turns.
func TestEveryLowerClassHasItsTurn(t *testing.T) {
	var s State
	p := &Params{Now: 1, TTL: 10, MaxRun: 9}
	got := backlog(t, &s, p, []Update{{Name: "chat", Weight: 1, Priority: 1}, {Name: "normal", Weight: 1}, {Name: "batch", Weight: 1, Priority: -1}}, 1000, func(int, int) float64 { return 1 })
	if got[flowID{1, "chat"}] != 900 || got[flowID{0, "normal"}] != 50 || got[flowID{-1, "batch"}] != 50 {
		t.Fatalf("served %v of 1000: want chat 900, and 50 each for the two lower classes", got)
	}
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 3))
		var s State
		n := 1 + rng.IntN(9)
		p := &Params{Now: 1, TTL: 10, MaxRun: n}
		var flows []Update
		top := -100
		for i := range 2 + rng.IntN(8) {
			c := rng.IntN(5) - 2
			top = max(top, c)
			flows = append(flows, Update{Name: fmt.Sprint("f", i), Priority: c, Weight: []float64{1, minWeight, maxWeight, 3}[rng.IntN(4)]})
		}
		turns := 500
		got := backlog(t, &s, p, flows, turns, func(turn, flow int) float64 { return float64(1 + (turn+flow)%4) })
		lowTurns := 0
		for _, f := range flows {
			if f.Priority < top && got[flowID{f.Priority, f.Name}] > 0 {
				lowTurns++ // counted below by turns, not cost
			}
		}
		lows := false
		for _, f := range flows {
			lows = lows || f.Priority < top
		}
		if !lows {
			continue
		}
		// Count the turns of the lower classes by replaying: the run above
		// is deterministic.
		var r State
		q := &Params{Now: 1, TTL: 10, MaxRun: n}
		low := 0
		for i := range turns {
			ups := make([]Update, len(flows))
			for j, f := range flows {
				f.Cost = float64(1 + (i+j)%4)
				ups[j] = f
			}
			if g := r.Turn(*q, "one", ups); g.Priority < top {
				low++
			}
			q.Now++
		}
		if want := turns / (n + 1); low < want {
			t.Fatalf("seed %d, n %d: the lower classes got %d of %d turns, want at least %d", seed, n, low, turns, want)
		}
	}
}

// One name in two classes is two flows: each keeps its own tags, and the
// lower one is not promoted by the higher one's requests.
func TestOneNameInTwoClassesIsTwoFlows(t *testing.T) {
	var s State
	p := &Params{Now: 1, TTL: 10, MaxRun: 9}
	got := backlog(t, &s, p, []Update{{Name: "acme", Weight: 1, Priority: -1}, {Name: "globex", Weight: 1}, {Name: "acme", Weight: 1, Priority: 1}}, 100, func(int, int) float64 { return 1 })
	if got[flowID{1, "acme"}] != 90 || got[flowID{-1, "acme"}] != 5 || got[flowID{0, "globex"}] != 5 {
		t.Fatalf("served %v: want acme's Interactive flow 90, and the lower classes' turns shared by acme's Batch flow and globex (5 each)", got)
	}
}

// An owner alone on the key is granted every call it makes with a flow
// registered (and no Hold), whatever it registered, left or let expire
// before: the lone process loses no turn (issue 37: it was refused the
// turn the rule against starvation owed to a flow it had not put forward).
func TestALoneOwnerIsGrantedEveryTurn(t *testing.T) {
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 4))
		var s State
		now := 0.0
		registered := map[flowID]bool{}
		for step := range 400 {
			p, _, ups := randomCall(rng, &now, []string{"one"}, 30)
			if rng.IntN(3) == 0 { // asks again without news, as a dispatcher does
				ups = nil
			}
			r := s.Turn(p, "one", ups)
			if r.Renewed {
				clear(registered)
			}
			if p.Fresh {
				clear(registered)
			}
			for _, u := range ups {
				registered[flowID{u.Priority, u.Name}] = !u.Leave
			}
			waits := false
			for _, ok := range registered {
				waits = waits || ok
			}
			if waits && !p.Hold && !r.Granted {
				t.Fatalf("seed %d, step %d: a lone owner with flows registered was refused: %+v %+v", seed, step, p, ups)
			}
			if r.Granted {
				id := flowID{r.Priority, r.Name}
				if !registered[id] {
					t.Fatalf("seed %d, step %d: granted %v, which it had not registered", seed, step, id)
				}
				for _, u := range ups {
					if (flowID{u.Priority, u.Name}) == id && u.Last {
						registered[id] = false
					}
				}
			}
		}
	}
}

// Another owner's flow, best placed, holds the turn until that owner's TTL
// passes, and a leaving one not at all; a flow granted as Last stops
// waiting, and an owner with nothing registered is forgotten.
func TestTurnsAcrossOwners(t *testing.T) {
	var s State
	p := Params{Now: 100, TTL: 50}
	if r := s.Turn(p, "p2", []Update{{Name: "b", Weight: 1, Cost: 1}}); r.Name != "b" || !r.Renewed {
		t.Fatalf("b alone: %+v", r)
	}
	p.Now++
	if r := s.Turn(p, "p1", []Update{{Name: "a", Weight: 1, Cost: 1}}); r.Name != "a" { // a starts at V = 0
		t.Fatalf("a, new: %+v", r)
	}
	p.Now++
	if r := s.Turn(p, "p1", nil); r.Granted || r.Renewed {
		t.Fatalf("a after one turn, b waiting with the same tag but served earlier: %+v", r)
	}
	p.Now += 30
	s.Turn(p, "p1", nil) // p1 still waits
	p.Now += 30          // p2's TTL passes: b stopped waiting
	if r := s.Turn(p, "p1", nil); r.Name != "a" {
		t.Fatalf("a after p2's TTL: %+v", r)
	}
	if r := s.Turn(p, "p2", []Update{{Name: "b", Weight: 1, Cost: 1}}); r.Name != "b" || !r.Renewed {
		t.Fatalf("b back, p2 renewed: %+v", r)
	}
	if r := s.Turn(p, "p2", nil); r.Granted {
		t.Fatalf("b again, while a waits with the same start tag, served less recently: %+v", r)
	}
	s.Turn(p, "p1", []Update{{Name: "a", Leave: true}})
	if r := s.Turn(p, "p2", []Update{{Name: "b", Weight: 1, Cost: 1, Last: true}}); r.Name != "b" {
		t.Fatalf("b once a left: %+v", r)
	}
	if s.Active(p.Now) {
		t.Fatalf("every owner left, the key still waits")
	}
}

// Once nobody waits, the key starts over: the next flow starts at V = 0,
// whatever was served before (a store may have let the key expire).
func TestTheKeyStartsOverOnceNobodyWaits(t *testing.T) {
	var s State
	p := &Params{Now: 1, TTL: 10}
	backlog(t, &s, p, []Update{{Name: "a", Weight: 1}}, 50, func(int, int) float64 { return 1 })
	if s.V(0) == (Tag{}) {
		t.Fatal("V did not move")
	}
	p.Now = 100 // the owner's TTL has passed
	r := s.Turn(*p, "two", []Update{{Name: "b", Weight: 1, Cost: 1}})
	if !r.Granted || r.Start != (Tag{}) || s.V(0) != (Tag{}) || s.Flows() != 1 {
		t.Fatalf("after everyone stopped waiting: %+v, %d flows", r, s.Flows())
	}
}

// The state is bounded: flows that stopped waiting with their tags ahead
// of V are kept up to MaxParked, the ones V reaches first forgotten first.
func TestParkedFlowsAreBounded(t *testing.T) {
	var s State
	p := &Params{Now: 1, TTL: 1e3}
	// A keeps the key busy; each of the others is served once (tag 1
	// ahead of V, which A's maxWeight turns hardly move) and leaves.
	s.Turn(*p, "one", []Update{{Name: "A", Weight: maxWeight, Cost: 1}})
	for i := range MaxParked + 100 {
		r := s.Turn(*p, "one", []Update{{Name: fmt.Sprint(i), Weight: 1, Cost: 1, Last: true}})
		if !r.Granted || r.Name != fmt.Sprint(i) {
			t.Fatalf("flow %d, new: %+v", i, r)
		}
	}
	if n := s.Flows(); n != MaxParked+1 {
		t.Fatalf("%d flows kept, want the bound %d and A", n, MaxParked)
	}
}

// Tag.Add is exact to about 106 bits: adding 1e-6 a million times to 1e10
// gives 1e10 + 1 within 1e-16 relative, where float64 steps drop it.
func TestTagAddKeepsSmallSteps(t *testing.T) {
	x, f := Tag{Hi: 1e10}, 1e10
	for range 1_000_000 {
		x = x.Add(1e-6)
		f += 1e-6
	}
	if got := x.Hi - 1e10 + x.Lo; math.Abs(got-1) > 1e-6 {
		t.Fatalf("1e10 + 10^6 x 1e-6 = 1e10 + %v", got)
	}
	if f-1e10 > 2.5 || f-1e10 < 1.5 { // the float64 sum's known error, so that the test measures something
		t.Logf("float64 drift: %v", f-1e10)
	}
	if (Tag{Hi: 1, Lo: 0}).Add(0).Lo != 0 || math.Signbit((Tag{}).Add(0).Lo) {
		t.Fatal("a zero step changed the tag, or left -0")
	}
}

// BenchmarkTurn: one turn of an owner alone on a key with n flows
// waiting (each turn re-registers the flow granted, as a dispatcher does).
func BenchmarkTurn(b *testing.B) {
	for _, n := range []int{16, 1000, 10000} {
		b.Run(fmt.Sprint("flows=", n), func(b *testing.B) {
			var s State
			p := Params{Now: 1, TTL: 1e3}
			for i := range n {
				s.Turn(p, "one", []Update{{Name: fmt.Sprint("t", i), Weight: float64(1 + i%3), Cost: 1, Priority: i % 3}})
			}
			var ups [1]Update
			b.ResetTimer()
			for range b.N {
				r := s.Turn(p, "one", ups[:0])
				ups[0] = Update{Name: r.Name, Priority: r.Priority, Weight: 1, Cost: 1}
			}
		})
	}
}

// The bounds of shaper.Flow's Weight.
const minWeight, maxWeight = 1e-6, 1e6
