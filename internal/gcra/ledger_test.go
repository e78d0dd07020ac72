package gcra

import (
	"fmt"
	"math"
	"math/rand/v2"
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

// seeds is how many random sequences the property runs.
var seeds = 3000

// run drives random reserve / wait / pause / cancel / settle (and second settles
// and cancels of copies) on one key and returns the departures the callers
// made, with their actual costs, and how many units were given back.
func run(seed uint64, rule func(ky *key, h *held, actual int64, now float64), overrun bool) (deps []conform.Departure, interval, tau float64, refunded int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	burst := 1 + rng.IntN(6)
	interval = float64(1 + rng.IntN(100))
	tau = interval * float64(burst)
	k := &Kernel{Interval: interval, Tau: tau, MaxWait: interval * float64(5+rng.IntN(40))}
	ky := &key{k: k, s: Cold, settle: rule}
	now := 1000.0
	var all []*held
	for range 300 {
		switch op := rng.IntN(20); {
		case op < 8:
			cost := int64(1 + rng.IntN(burst+2)) // some above the burst
			if k.Admissible(cost) {
				if h, ok := ky.reserve(now, cost); ok {
					if trace != nil {
						trace("now %v reserve %v -> at %v seq %v s %v", now, cost, h.at, h.seq, ky.s)
					}
					all = append(all, h)
				}
			}
		case op < 11 && len(all) > 0: // cancel, sometimes a copy again, sometimes too late
			h := all[rng.IntN(len(all))]
			if now >= h.at {
				continue // a late Cancel does nothing: the caller may have left
			}
			if !h.cancelled && h.actual < 0 {
				h.cancelled = true
			}
			before := ky.s
			rule(ky, h, -1, now)
			if ky.s < before {
				refunded++
			}
		case op < 15 && len(all) > 0: // settle, sometimes a copy again
			h := all[rng.IntN(len(all))]
			actual := rng.Int64N(h.cost + 1)
			if overrun && rng.IntN(3) == 0 {
				actual = h.cost + rng.Int64N(3)
			}
			if !h.cancelled && h.actual < 0 {
				h.actual = actual
			}
			before := ky.s
			rule(ky, h, actual, now)
			if ky.s < before {
				refunded++
			}
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
		c := h.cost
		if h.actual >= 0 {
			c = h.actual
		}
		deps = append(deps, conform.Departure{At: h.at, Cost: c})
	}
	return deps, interval, tau, refunded
}

// The guarantee, for the GCRA family: whatever callers cancel and settle
// (for less than they reserved), and in whatever order, the departures
// they make with their actual costs conform to the contract.
func TestSettledAndCancelledDeparturesConform(t *testing.T) {
	refunds := 0
	for seed := range uint64(seeds) {
		deps, interval, tau, n := run(seed, giveBack, false)
		refunds += n
		if d, ok := conform.Check(interval, tau, deps); !ok {
			t.Fatalf("seed %d: the departure %v breaks the contract (T=%v tau=%v): %v", seed, d, interval, tau, deps)
		}
	}
	if refunds < 1000 {
		t.Fatalf("only %d give-backs lowered a TAT: the property is not exercised", refunds)
	}
}

// The property catches a rule that gives back too much: each mutant must
// fail it on some seed.
func TestTheConformancePropertyCatchesGenerousRules(t *testing.T) {
	mutants := map[string]func(ky *key, h *held, actual int64, now float64){
		"refund the whole difference whenever a Ledger exists": func(ky *key, h *held, actual int64, now float64) {
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
		},
		"the tail rule without a generation": func(ky *key, h *held, actual int64, now float64) {
			if actual < 0 {
				actual = 0
			}
			if ky.s == h.tag {
				ky.s -= ky.k.Interval * float64(h.cost-actual)
			}
		},
		"refund twice the Ledger's amount": func(ky *key, h *held, actual int64, now float64) {
			before := ky.s
			giveBack(ky, h, actual, now)
			ky.s -= before - ky.s
		},
		"holes not counted in the marks": func(ky *key, h *held, actual int64, now float64) {
			giveBack(ky, h, actual, now)
			if ky.l != nil && actual < 0 {
				for i := range ky.l.Marks {
					ky.l.Marks[i].Q -= ky.k.Interval * float64(h.cost)
				}
			}
		},
	}
	for name, rule := range mutants {
		caught := false
		for seed := range uint64(3000) {
			deps, interval, tau, _ := run(seed, rule, false)
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
// cancel / settle sequences from fuzzed seeds.
func FuzzLedgerKeepsTheContract(f *testing.F) {
	for _, seed := range []uint64{0, 2, 4, 7, 10} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		deps, interval, tau, _ := run(seed, giveBack, false)
		if d, ok := conform.Check(interval, tau, deps); !ok {
			t.Fatalf("seed %d: the departure %v breaks the contract (T=%v tau=%v): %v", seed, d, interval, tau, deps)
		}
	})
}
