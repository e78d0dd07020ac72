package gcra

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/conform"
)

// held is one reservation of the simulated key, as its caller holds it.
type held struct {
	at, tag   float64
	cost      int64
	seq       float64
	gen       int
	cancelled bool  // its caller gave it back before its time: it never departs
	actual    int64 // -1 until settled
	// granted and settled are the steps of the run that granted it and
	// settled it first (the checker judges each departure with the
	// overruns known at its grant).
	granted, settled int
}

// key is one key of the GCRA family as a store keeps it: the TAT, the
// generation of its last grant (the memory store's tail rule before a key
// has a Ledger) and its Ledger once something was given back.
type key struct {
	k      *Kernel
	s      float64
	paused float64 // a pause's end: nothing departs before it
	gen    int
	l      *Ledger
	// settle is the rule under test; the mutants replace it.
	settle func(ky *key, h *held, actual int64, now float64)
	// expire: a Ledger idle at a grant is gone (its Redis keys expired),
	// and the next give-back starts one by the tail rule; otherwise a fresh
	// one is made (the memory store).
	expire bool
}

func (ky *key) reserve(now float64, cost int64) (*held, bool) {
	floor := max(now, ky.paused)
	next, wait, ok := ky.k.Reserve(ky.s, now, floor, cost)
	before := math.Inf(1)
	if ok {
		before = now + wait
	}
	if ky.l != nil {
		if at, seq, took := ky.l.Take(ky.k, now, floor, before, cost); took {
			return &held{at: at, tag: ky.s, cost: cost, seq: seq, gen: -1, actual: -1}, true
		}
	}
	if !ok {
		return nil, false
	}
	if ky.l != nil && ky.l.Idle(ky.s, now) { // cold, no hole ahead: the Redis keys expired, or memory makes a fresh Ledger
		old := ky.l
		ky.l = nil
		if !ky.expire {
			ky.l = ky.k.RenewLedger(old, ky.s, now)
		}
	}
	ky.s = next
	ky.gen++
	h := &held{at: now + wait, tag: next, cost: cost, gen: ky.gen, actual: -1}
	if ky.l != nil {
		h.seq = ky.l.Grant(ky.k, h.at, cost)
	}
	return h, true
}

// giveBack is the stores' Settle and Cancel (actual 0 before its time):
// before the key has a Ledger only the tail refunds, and the first give-back
// creates one.
func giveBack(ky *key, h *held, actual int64, now float64) {
	if ky.l == nil {
		if h.seq == 0 && h.gen == ky.gen && ky.s == h.tag {
			ky.s = ky.k.SettleTail(ky.s, h.at, h.cost, max(actual, 0))
			ky.gen++
			ky.l = ky.k.NewLedger(ky.s, now)
			ky.l.Claim(h.tag)
			ky.l.Overran(ky.k, h.at, h.cost, max(actual, 0), ky.s, now)
			return
		}
		ky.l = ky.k.NewLedger(ky.s, now)
	}
	if actual < 0 {
		ky.s = ky.l.Cancel(ky.k, ky.s, h.at, h.cost, h.seq, h.tag, now)
		return
	}
	ky.s = ky.l.Settle(ky.k, ky.s, h.at, h.cost, actual, h.seq, h.tag, now)
}

var trace func(string, ...any)

// runStats counts what a run exercised: give-backs that lowered the TAT
// (refunded; refundsAfterOverrun, once a settle for more came before),
// and reservations granted a hole at or after an instant settled for more
// before their grant.
type runStats struct{ refunded, refundsAfterOverrun, holesAfterOverrun int }

func (st *runStats) lowered(lowered bool, overranAt float64) {
	if lowered {
		st.refunded++
		if !math.IsInf(overranAt, 1) {
			st.refundsAfterOverrun++
		}
	}
}

func (st *runStats) add(o runStats) {
	st.refunded += o.refunded
	st.refundsAfterOverrun += o.refundsAfterOverrun
	st.holesAfterOverrun += o.holesAfterOverrun
}

// seeds is how many random sequences the property runs.
var seeds = 3000

// run drives random reserve / wait / pause / cancel / settle (and second settles
// and cancels of copies) on one key and returns the departures the callers
// made, with their actual costs, and how many units were given back. With
// overrun, a third of the settles are for more than reserved.
func run(seed uint64, rule func(ky *key, h *held, actual int64, now float64), overrun bool) (deps []conform.Departure, interval, tau float64, st runStats) {
	rng := rand.New(rand.NewPCG(seed, 7))
	burst := 1 + rng.IntN(6)
	interval = float64(1 + rng.IntN(100))
	tau = interval * float64(burst)
	k := &Kernel{Interval: interval, Tau: tau, MaxWait: interval * float64(5+rng.IntN(40))}
	ky := &key{k: k, s: Cold, settle: rule, expire: rng.IntN(2) == 0}
	now := 1000.0
	var all []*held
	overranAt := math.Inf(1) // the earliest departure settled for more so far
	ev := 0                  // the events of the run, in order: grants and settles
	reserve := func(cost int64) *held {
		if !k.Admissible(cost) {
			return nil
		}
		h, ok := ky.reserve(now, cost)
		if !ok {
			return nil
		}
		if trace != nil {
			trace("now %v reserve %v -> at %v seq %v s %v", now, cost, h.at, h.seq, ky.s)
		}
		ev++
		h.granted = ev
		if h.gen < 0 && overranAt <= h.at {
			st.holesAfterOverrun++
		}
		all = append(all, h)
		return h
	}
	cancel := func(h *held) {
		if now >= h.at {
			return // a late Cancel does nothing: the caller may have left
		}
		if !h.cancelled && h.actual < 0 {
			h.cancelled = true
		}
		if trace != nil {
			trace("now %v cancel %v", now, h)
		}
		before := ky.s
		rule(ky, h, -1, now)
		st.lowered(ky.s < before, overranAt)
	}
	settle := func(h *held, actual int64) {
		ev++
		first := !h.cancelled && h.actual < 0
		if first {
			h.actual, h.settled = actual, ev
		}
		if trace != nil {
			trace("now %v settle %v at %v", now, h, actual)
		}
		before := ky.s
		rule(ky, h, actual, now)
		st.lowered(ky.s < before, overranAt)
		if first && actual > h.cost {
			overranAt = min(overranAt, h.at)
		}
	}
	// pick returns a reservation to cancel or settle: half the time one of
	// the latest four (a call settled as it returns, a wait cancelled soon:
	// the tail of a burst, its first give-back included), else any.
	pick := func() *held {
		if rng.IntN(2) == 0 {
			return all[len(all)-1-rng.IntN(min(len(all), 4))]
		}
		return all[rng.IntN(len(all))]
	}
	for range 300 {
		switch op := rng.IntN(20); {
		case op < 8:
			reserve(int64(1 + rng.IntN(burst+2))) // some above the burst
		case op == 18: // a burst behind a pause: several slots at one instant, ahead
			ky.paused = max(ky.paused, now+float64(rng.IntN(int(5*interval))))
			var got []*held
			for range 2 + rng.IntN(burst+2) {
				if h := reserve(int64(1 + rng.IntN(burst))); h != nil {
					got = append(got, h)
				}
			}
			if overrun && len(got) > 1 && rng.IntN(2) == 0 {
				// Its last call returns first and costs more; another of
				// it gives up before its slot.
				last := got[len(got)-1]
				settle(last, last.cost+1+rng.Int64N(3))
				cancel(got[rng.IntN(len(got)-1)])
			}
		case op < 11 && len(all) > 0: // cancel, sometimes a copy again, sometimes too late
			cancel(pick())
		case op < 15 && len(all) > 0: // settle, sometimes a copy again
			h := pick()
			actual := rng.Int64N(h.cost + 1)
			if overrun && rng.IntN(3) == 0 {
				actual = h.cost + rng.Int64N(3)
			}
			settle(h, actual)
		case op == 19:
			ky.paused = now + float64(rng.IntN(int(5*interval)))
		default:
			now += float64(rng.IntN(int(3 * interval)))
		}
	}
	for _, h := range all {
		if h.cancelled {
			continue
		}
		d := conform.Departure{At: h.at, Cost: h.cost, Granted: h.granted}
		if h.actual >= 0 {
			d.Cost = h.actual
			if h.actual > h.cost {
				d.Reserved, d.Settled = h.cost, h.settled
			}
		}
		deps = append(deps, d)
	}
	return deps, interval, tau, st
}

// The guarantee, for the GCRA family: whatever callers cancel and settle
// (for less than they reserved, or for more), and in whatever order, the
// departures they make with their actual costs conform to the contract;
// an overrun is charged, never refused, so a departure is judged with the
// overruns settled before its grant (conform.Check), and every slot
// granted after an overrun, a hole's included, makes room for it.
func TestSettledAndCancelledDeparturesConform(t *testing.T) {
	var st runStats
	for seed := range uint64(seeds) {
		for _, overrun := range []bool{false, true} {
			deps, interval, tau, n := run(seed, giveBack, overrun)
			st.add(n)
			if d, ok := conform.Check(interval, tau, deps); !ok {
				t.Fatalf("seed %d, overruns %v: the departure %+v breaks the contract (T=%v tau=%v): %+v", seed, overrun, d, interval, tau, deps)
			}
		}
	}
	t.Logf("%+v", st)
	if st.refunded < 1000 || st.holesAfterOverrun < 100 || st.refundsAfterOverrun < 100 {
		t.Fatalf("%+v: the property is not exercised (give-backs that lowered a TAT; holes taken, and TATs lowered, after an overrun settled before them)", st)
	}
}

// The property catches a rule that gives back too much: each mutant must
// fail it on some seed (the overrun's, in runs with overruns).
func TestTheConformancePropertyCatchesGenerousRules(t *testing.T) {
	type mutant struct {
		rule    func(ky *key, h *held, actual int64, now float64)
		overrun bool
	}
	mutants := map[string]mutant{
		"refund the whole difference whenever a Ledger exists": {rule: func(ky *key, h *held, actual int64, now float64) {
			if ky.l == nil {
				giveBack(ky, h, actual, now)
				return
			}
			if actual < 0 {
				actual = 0
			}
			if ky.l.claim(h.seq) == claimed {
				ky.s -= ky.k.Interval * float64(h.cost-actual)
			}
		}},
		"the tail rule without a generation": {rule: func(ky *key, h *held, actual int64, now float64) {
			if actual < 0 {
				actual = 0
			}
			if ky.s == h.tag {
				ky.s -= ky.k.Interval * float64(h.cost-actual)
			}
		}},
		"refund twice the Ledger's amount": {rule: func(ky *key, h *held, actual int64, now float64) {
			before := ky.s
			giveBack(ky, h, actual, now)
			ky.s -= before - ky.s
		}},
		"holes not counted in the marks": {rule: func(ky *key, h *held, actual int64, now float64) {
			giveBack(ky, h, actual, now)
			if ky.l != nil && actual < 0 {
				for i := range ky.l.Marks {
					ky.l.Marks[i].Q -= ky.k.Interval * float64(h.cost)
				}
			}
		}},
		// The defect the model found (101): an overrun charged on the TAT
		// alone, the holes after it handed out whole.
		"an overrun leaves the holes after it whole": {overrun: true, rule: func(ky *key, h *held, actual int64, now float64) {
			var holes []Hole
			if ky.l != nil {
				holes = slices.Clone(ky.l.Holes)
			}
			giveBack(ky, h, actual, now)
			if ky.l != nil && holes != nil && actual > h.cost {
				ky.l.Holes = holes
			}
		}},
		"a cancel forgets the overruns settled since its grant": {overrun: true, rule: func(ky *key, h *held, actual int64, now float64) {
			if ky.l == nil || actual >= 0 {
				giveBack(ky, h, actual, now)
				return
			}
			kept := ky.l.Overruns
			ky.l.Overruns = nil
			giveBack(ky, h, actual, now)
			ky.l.Overruns = kept
		}},
		"the tail rule forgets its overrun": {overrun: true, rule: func(ky *key, h *held, actual int64, now float64) {
			tail := ky.l == nil && h.seq == 0 && h.gen == ky.gen && ky.s == h.tag
			giveBack(ky, h, actual, now)
			if tail {
				ky.l.Overruns = nil
			}
		}},
	}
	for name, m := range mutants {
		caught := false
		for seed := range uint64(3000) {
			deps, interval, tau, _ := run(seed, m.rule, m.overrun)
			if _, ok := conform.Check(interval, tau, deps); !ok {
				caught = true
				break
			}
		}
		if !caught {
			t.Errorf("mutant %q passed 3000 seeds: the property does not see it", name)
		}
	}
}

// Settling more than reserved charges the extra at once: the next
// reservation on a busy key departs the extra later.
func TestSettlingMoreChargesTheExtra(t *testing.T) {
	k := &Kernel{Interval: 10, Tau: 10, MaxWait: 1000}
	ky := &key{k: k, s: Cold}
	a, _ := ky.reserve(0, 1) // departs 0
	b, _ := ky.reserve(0, 1) // departs 10
	giveBack(ky, b, 1, 0)    // creates the Ledger; b is pre-Ledger: nothing
	c, _ := ky.reserve(0, 1) // departs 20
	giveBack(ky, c, 4, 0)    // 3 more units: 30 ms
	d, _ := ky.reserve(0, 1)
	if want := 60.0; d.at != want {
		t.Fatalf("after settling 3 units more the next departs at %v, want %v", d.at, want)
	}
	_ = a
}

func (h *held) String() string { return fmt.Sprintf("{at %v cost %v seq %v}", h.at, h.cost, h.seq) }

// FuzzLedgerKeepsTheContract runs the property's random reserve / pause /
// cancel / settle sequences from fuzzed seeds, with and without overruns.
func FuzzLedgerKeepsTheContract(f *testing.F) {
	for _, seed := range []uint64{0, 2, 4, 7, 10} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, seed uint64, overrun bool) {
		deps, interval, tau, _ := run(seed, giveBack, overrun)
		if d, ok := conform.Check(interval, tau, deps); !ok {
			t.Fatalf("seed %d, overruns %v: the departure %+v breaks the contract (T=%v tau=%v): %+v", seed, overrun, d, interval, tau, deps)
		}
	})
}

// The Ledger step by step on one key (10/s burst 10, MaxQueue 2 s, ms from
// a cold start at 0): the slots granted after the last give-back, and the
// departures, each judged with the overruns settled before its grant,
// conform.
//
// An overrun counts in every give-back after it (the model's defect 101):
// a hole at or after its instant keeps only what the extra leaves of it,
// however the overrun and the cancel that left the hole come in order,
// from the Ledger's rule or the tail rule, once however many copies are
// settled; a hole left by a reservation granted after the overrun, or
// lying before its instant, is whole; a settle for less after an overrun,
// or before it, gives back its own.
//
// A copy of a reservation given back names no slot of the Ledger that
// replaced its own when the key went idle within the same instant.
func TestLedgerStepTable(t *testing.T) {
	type op struct {
		kind   byte // 'r' n reservations of cost; 'c' cancel #i; 's' settle #i at actual; 'a' advance d; 'p' pause until d
		n, i   int
		cost   int64
		actual int64
		d      float64
	}
	r := func(n int, cost int64) op { return op{kind: 'r', n: n, cost: cost} }
	c := func(i int) op { return op{kind: 'c', i: i} }
	s := func(i int, actual int64) op { return op{kind: 's', i: i, actual: actual} }
	adv := func(d float64) op { return op{kind: 'a', d: d} }
	pause := func(until float64) op { return op{kind: 'p', d: until} }
	cases := []struct {
		name string
		ops  []op
		want []float64 // the slots granted after the last give-back; -1 refused
	}{
		// Slots 0 (ten), then one each 100 ms to 2 s: the hole at 1.1 s is
		// 100 ms; the overrun of 800 ms at 0 takes it.
		{"the model's finding: a hole, then an overrun before it",
			[]op{r(30, 1), adv(357), c(20), s(3, 9), r(1, 1)}, []float64{-1}},
		{"an overrun, then a cancel after its instant of a slot granted before it",
			[]op{r(30, 1), adv(357), s(3, 9), c(20), r(1, 1)}, []float64{-1}},
		// A hole of 300 ms at 300 ms; an overrun of 100 ms leaves 200.
		{"an overrun smaller than the hole leaves the rest",
			[]op{r(10, 1), r(1, 3), r(10, 1), adv(100), c(10), s(2, 2), r(1, 3), r(1, 2)}, []float64{1700, 300}},
		{"a hole before the overrun's instant is whole",
			[]op{r(30, 1), adv(50), c(12), s(25, 9), r(1, 1)}, []float64{300}},
		// Ten behind a pause at 1 s; the last settled first, by the tail
		// rule, for 2 more; another of them cancelled.
		{"the tail rule's overrun counts in the holes of the slots before it",
			[]op{pause(1000), r(10, 1), s(9, 3), c(4), r(1, 1)}, []float64{1300}},
		{"a slot granted after the overrun leaves a whole hole",
			[]op{r(20, 1), s(3, 9), r(1, 1), c(20), r(1, 1)}, []float64{1900}},
		{"a copy of the overrun settled again takes nothing more",
			[]op{r(10, 1), r(1, 3), r(10, 1), adv(100), c(10), s(2, 2), s(2, 2), r(1, 2)}, []float64{300}},
		// Nine overruns of 100 ms at 0, more than a Ledger keeps apart: a
		// hole of 1 s at 1 s keeps 100 ms.
		{"overruns merged count for all of them",
			[]op{r(10, 1), r(1, 10), s(0, 2), s(1, 2), s(2, 2), s(3, 2), s(4, 2), s(5, 2), s(6, 2), s(7, 2), s(8, 2), c(10), r(1, 2), r(1, 1)}, []float64{-1, 1000}},
		// A Ledger from a give-back on an idle key: the fifteen slots at
		// 200 ms are recorded in it.
		{"a settle for less after an overrun gives back its own",
			[]op{r(1, 1), s(0, 1), adv(200), r(15, 1), s(1, 5), r(1, 1), s(16, 0), r(1, 1)}, []float64{1200}},
		{"a settle for less before an overrun gives back its own",
			[]op{r(1, 1), s(0, 1), adv(200), r(15, 1), s(15, 0), s(1, 5), r(1, 1)}, []float64{1100}},
		// #1 cancelled at its slot leaves the key idle: the next grant, in
		// the same millisecond, renews the Ledger; a copy of #1 cancelled
		// again must not give back the slot of #2, numbered after it.
		{"a copy cancelled after its Ledger was renewed in the same instant",
			[]op{r(1, 1), s(0, 1), adv(200), r(1, 1), c(1), r(10, 1), c(1), r(1, 1)}, []float64{300}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ky := &key{k: &Kernel{Interval: 100, Tau: 1000, MaxWait: 2000}, s: Cold}
			now := 0.0
			var all []*held
			var got []float64
			for ev, o := range tc.ops {
				switch o.kind {
				case 'r':
					for range o.n {
						h, ok := ky.reserve(now, o.cost)
						if !ok {
							got = append(got, -1)
							continue
						}
						h.granted = ev
						all = append(all, h)
						got = append(got, h.at)
					}
				case 'c':
					h := all[o.i]
					if now > h.at { // Reservation.Cancel gives back until its slot
						t.Fatalf("op %d: #%d at %v is past at %v", ev, o.i, h.at, now)
					}
					h.cancelled = h.cancelled || h.actual < 0
					giveBack(ky, h, -1, now)
					got = nil
				case 's':
					h := all[o.i]
					if !h.cancelled && h.actual < 0 {
						h.actual, h.settled = o.actual, ev
					}
					giveBack(ky, h, o.actual, now)
					got = nil
				case 'a':
					now += o.d
				case 'p':
					ky.paused = o.d
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("the slots granted after the last give-back: %v, want %v", got, tc.want)
			}
			var deps []conform.Departure
			for _, h := range all {
				if h.cancelled {
					continue
				}
				d := conform.Departure{At: h.at, Cost: h.cost, Granted: h.granted}
				if h.actual >= 0 {
					d.Cost = h.actual
					if h.actual > h.cost {
						d.Reserved, d.Settled = h.cost, h.settled
					}
				}
				deps = append(deps, d)
			}
			if d, ok := conform.Check(100, 1000, deps); !ok {
				t.Errorf("the departure %+v breaks the contract: %+v", d, deps)
			}
		})
	}
}
