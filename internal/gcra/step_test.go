package gcra

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// refStep is Kernel.Step written out from the kernel's primitives the way
// the memory store made it before Step existed: a key without a Ledger
// takes the bare transition; a key with one takes the earliest hole that
// fits before its slot (a Ledger of its own contract only), or else its
// slot, recorded in the Ledger, in a fresh one when the key was idle, and
// with none when the Ledger is another contract's.
func refStep(k *Kernel, in Key, now float64, cost int64) Step {
	next, wait, allowed := k.Reserve(in.TAT, now, in.Floor, cost)
	remaining := func(tat float64) int64 {
		r := k.Remaining(tat, now)
		if in.Clamped && r > 1 {
			r = 1
		}
		return r
	}
	l := in.Ledger
	if l == nil {
		if !allowed {
			return Step{Wait: wait, TAT: in.TAT}
		}
		return Step{Allowed: true, Wait: wait, Remaining: remaining(next), At: now + wait, TAT: next, Moved: true}
	}
	before := math.Inf(1)
	if allowed {
		before = now + wait
	}
	fits := l.Fits(k)
	if fits {
		if at, seq, ok := l.Take(k, now, in.Floor, before, cost); ok {
			return Step{Allowed: true, Wait: at - now, Remaining: remaining(in.TAT), At: at, TAT: in.TAT, Seq: seq, Ledger: l}
		}
	}
	if !allowed {
		return Step{Wait: wait, TAT: in.TAT, Ledger: l}
	}
	out := Step{Allowed: true, Wait: wait, Remaining: remaining(next), At: now + wait, TAT: next, Moved: true}
	switch {
	case l.Idle(in.TAT, now):
		out.Ledger = k.RenewLedger(l, in.TAT, now)
		out.Seq = out.Ledger.Grant(k, out.At, cost)
	case !fits:
	default:
		out.Ledger = l
		out.Seq = l.Grant(k, out.At, cost)
	}
	return out
}

// cloneLedger returns a copy of l that shares nothing with it.
func cloneLedger(l *Ledger) *Ledger {
	if l == nil {
		return nil
	}
	c := *l
	c.Marks, c.Holes, c.Overruns, c.pre = slices.Clone(l.Marks), slices.Clone(l.Holes), slices.Clone(l.Overruns), slices.Clone(l.pre)
	return &c
}

// stepCase counts the situations a run put Step in.
type stepCase struct {
	noLedger, withLedger, holes, holeTaken, otherContract, dropped int
	idle, freshLedger, floored, clamped, refused, deadline         int
	holeRemaining                                                  int // a hole taken with units still admissible at once
}

// stepGrant is one reservation as its caller holds it.
type stepGrant struct {
	at, tag float64
	cost    int64
	seq     float64
	gen     int // the key's generation after its grant; -1 for a hole
	k       *Kernel
}

// stepSim is one key as the memory store keeps it, driven by random
// reservations, cancels, settles, pauses, partners' clamps and live
// contract changes.
type stepSim struct {
	k             *Kernel
	s             float64
	gen           int
	l             *Ledger
	paused        float64
	next, ival    float64 // a partner's clamp: its next slot and interval
	end           float64 // its end (0: none)
	contracts     [2]*Kernel
	cur           int
	seen          stepCase
	trail         []string
	compareFailed func(format string, args ...any)
}

func (ky *stepSim) key(now float64) Key {
	in := Key{TAT: ky.s, Ledger: ky.l, Floor: max(now, ky.paused)}
	if now < ky.end {
		in.Clamped = true
		in.Floor = max(in.Floor, min(ky.next, ky.end))
	}
	return in
}

// reserve steps the key with Step and with refStep on copies of its Ledger,
// compares them, and keeps Step's outcome.
func (ky *stepSim) reserve(k *Kernel, now float64, cost int64) (*stepGrant, bool) {
	in := ky.key(now)
	if in.Floor > now {
		ky.seen.floored++
	}
	if in.Clamped {
		ky.seen.clamped++
	}
	switch l := in.Ledger; {
	case l == nil:
		ky.seen.noLedger++
	default:
		ky.seen.withLedger++
		if len(l.Holes) > 0 {
			ky.seen.holes++
		}
		if !l.Fits(k) {
			ky.seen.otherContract++
		}
		if l.Idle(in.TAT, now) {
			ky.seen.idle++
		}
	}
	refIn := in
	refIn.Ledger = cloneLedger(in.Ledger)
	got := step(k, in, now, cost)
	want := refStep(k, refIn, now, cost)
	gotL, wantL := got.Ledger, want.Ledger
	got.Ledger, want.Ledger = nil, nil
	switch {
	case got != want:
		ky.compareFailed("Step %+v, want %+v", got, want)
	case (gotL == nil) != (wantL == nil) || (gotL == in.Ledger) != (wantL == refIn.Ledger):
		ky.compareFailed("Step's Ledger %p (given %p), want %p (given %p)", gotL, in.Ledger, wantL, refIn.Ledger)
	case gotL != nil && !reflect.DeepEqual(gotL, wantL):
		ky.compareFailed("Step's Ledger %+v, want %+v", gotL, wantL)
	case in.Ledger != nil && !reflect.DeepEqual(in.Ledger, refIn.Ledger):
		ky.compareFailed("the Ledger given, after Step: %+v, want %+v", in.Ledger, refIn.Ledger)
	}
	if !got.Allowed {
		ky.seen.refused++
		return nil, false
	}
	h := &stepGrant{at: got.At, tag: got.TAT, cost: cost, seq: got.Seq, gen: -1, k: k}
	switch {
	case !got.Moved:
		ky.seen.holeTaken++
		if got.Remaining > 0 {
			ky.seen.holeRemaining++
		}
	case in.Ledger != nil && gotL == nil:
		ky.seen.dropped++
	case in.Ledger != nil && gotL != in.Ledger:
		ky.seen.freshLedger++
	}
	if got.Moved {
		ky.s = got.TAT
		ky.gen++
		h.gen = ky.gen
	}
	ky.l = gotL
	if now < ky.end && got.At < ky.end { // the clamp's next slot moves past the departure
		ky.next = max(ky.next, got.At) + ky.ival
	}
	return h, true
}

// giveBack is the memory store's settle (actual >= 0) and cancel (-1) of a
// single-key reservation on a shaper of one contract (memstore.settleTAT).
func (ky *stepSim) giveBack(h *stepGrant, actual int64, now float64) {
	k := ky.k
	seq := h.seq
	if h.k != k { // granted under a contract changed since: an extra is charged, nothing given back
		if actual <= h.cost {
			return
		}
		seq = -1
	}
	if ky.l != nil && !ky.l.Fits(k) || seq < 0 {
		ky.s = k.Charge(ky.s, h.cost, max(actual, 0))
		if ky.l != nil && ky.l.Fits(k) {
			ky.l.Overran(k, h.at, h.cost, max(actual, 0), ky.s, now)
		}
		return
	}
	if ky.l == nil {
		if seq == 0 && h.gen == ky.gen && ky.s == h.tag {
			ky.s = k.SettleTail(ky.s, h.at, h.cost, max(actual, 0))
			ky.gen++
			ky.l = k.NewLedger(ky.s, now)
			ky.l.Claim(h.tag)
			ky.l.Overran(k, h.at, h.cost, max(actual, 0), ky.s, now)
			return
		}
		ky.l = k.NewLedger(ky.s, now)
	}
	if actual < 0 {
		ky.s = ky.l.Cancel(k, ky.s, h.at, h.cost, seq, h.tag, now)
		return
	}
	ky.s = ky.l.Settle(k, ky.s, h.at, h.cost, actual, seq, h.tag, now)
}

func randomKernel(rng *rand.Rand) *Kernel {
	interval := float64(1+rng.IntN(100)) * 0.25
	return &Kernel{Interval: interval, Tau: interval * float64(1+rng.IntN(16)), MaxWait: interval * float64(rng.IntN(40))}
}

// runStep drives one random sequence on one key.
func runStep(t *testing.T, seed uint64) stepCase {
	rng := rand.New(rand.NewPCG(seed, 0x57e9))
	ky := &stepSim{contracts: [2]*Kernel{randomKernel(rng), randomKernel(rng)}}
	ky.k, ky.s = ky.contracts[0], Cold
	ky.compareFailed = func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d, after:\n  %s\n%s", seed, strings.Join(ky.trail, "\n  "), fmt.Sprintf(format, args...))
	}
	now := 1.7e12 // a present-day instant, ms
	var all []*stepGrant
	for range 300 {
		if len(ky.trail) > 12 {
			ky.trail = ky.trail[1:]
		}
		switch op := rng.IntN(40); {
		case op < 14:
			k := ky.k
			switch rng.IntN(4) {
			case 0: // Allow: no waiting
				c := *k
				c.MaxWait = 0
				k = &c
			case 1: // a caller's deadline
				ky.seen.deadline++
				c := *k
				c.MaxWait = min(c.MaxWait, float64(rng.IntN(int(3*k.Interval)+1)))
				k = &c
			}
			cost := int64(1 + rng.IntN(16))
			if !k.Admissible(cost) {
				continue
			}
			ky.trail = append(ky.trail, fmt.Sprintf("now %v reserve %d (kernel %+v) on s %v", now, cost, *k, ky.s))
			if h, ok := ky.reserve(k, now, cost); ok {
				h.k = ky.k
				all = append(all, h)
			}
		case op < 20 && len(all) > 0: // cancel before its time (sometimes a copy again)
			h := all[rng.IntN(len(all))]
			if now > h.at || h.k != ky.k {
				continue
			}
			ky.trail = append(ky.trail, fmt.Sprintf("now %v cancel %+v", now, *h))
			ky.giveBack(h, -1, now)
		case op < 26 && len(all) > 0:
			h := all[rng.IntN(len(all))]
			actual := rng.Int64N(h.cost + 3)
			ky.trail = append(ky.trail, fmt.Sprintf("now %v settle %+v at %d", now, *h, actual))
			ky.giveBack(h, actual, now)
		case op < 28:
			ky.paused = max(ky.paused, now+float64(rng.IntN(int(5*ky.k.Interval)+1)))
			ky.trail = append(ky.trail, fmt.Sprintf("now %v pause until %v", now, ky.paused))
		case op < 30: // a partner's clamp (memstore's Clamp)
			next := now
			if now < ky.end && ky.next > now && ky.next < ky.end {
				next = ky.next
			}
			ky.next, ky.ival, ky.end = next, float64(1+rng.IntN(int(2*ky.k.Interval)+1)), now+float64(rng.IntN(int(10*ky.k.Interval)+1))
			ky.trail = append(ky.trail, fmt.Sprintf("now %v clamp %v %v %v", now, ky.next, ky.ival, ky.end))
		case op == 30: // the contract changes live: the TAT is read under the new one
			old := ky.k
			ky.cur = 1 - ky.cur
			ky.k = ky.contracts[ky.cur]
			if ky.s != Cold {
				ky.s = ky.k.Convert(ky.s, now, old.Interval, old.Tau)
			}
			ky.trail = append(ky.trail, fmt.Sprintf("now %v contract %+v, s %v", now, *ky.k, ky.s))
		case op == 31: // idle long enough to go cold
			now += 50 * ky.k.Tau
		default:
			now += float64(rng.IntN(int(3*ky.k.Interval) + 1))
		}
	}
	return ky.seen
}

// Kernel.Step, the memory store's single call, makes the same decision and
// leaves the same key as the two paths it replaced, written out here from
// the kernel's primitives, on keys without a Ledger, with one and its
// holes, with another contract's, cold, paused or clamped (floor after
// now), and clamped (Remaining at most 1).
func TestStepMatchesItsPrimitives(t *testing.T) {
	seeds := 1000
	if testing.Short() {
		seeds = 200
	}
	var seen stepCase
	for seed := range uint64(seeds) {
		s := runStep(t, seed)
		seen.noLedger += s.noLedger
		seen.withLedger += s.withLedger
		seen.holes += s.holes
		seen.holeTaken += s.holeTaken
		seen.otherContract += s.otherContract
		seen.dropped += s.dropped
		seen.idle += s.idle
		seen.freshLedger += s.freshLedger
		seen.floored += s.floored
		seen.clamped += s.clamped
		seen.refused += s.refused
		seen.deadline += s.deadline
		seen.holeRemaining += s.holeRemaining
	}
	t.Logf("%+v", seen)
	if testing.Short() {
		return
	}
	for _, c := range []struct {
		name    string
		n, want int
	}{
		{"no Ledger", seen.noLedger, 20}, {"a Ledger", seen.withLedger, 20}, {"a Ledger with holes", seen.holes, 20},
		{"a hole taken", seen.holeTaken, 20}, {"a hole taken with units left", seen.holeRemaining, 1}, // rare: a few in a thousand runs
		{"another contract's Ledger", seen.otherContract, 20}, {"another contract's Ledger dropped", seen.dropped, 20},
		{"an idle Ledger", seen.idle, 20}, {"a fresh Ledger", seen.freshLedger, 20},
		{"floor after now", seen.floored, 20}, {"clamped", seen.clamped, 20},
		{"refused", seen.refused, 20}, {"a deadline", seen.deadline, 20},
	} {
		if c.n < c.want {
			t.Errorf("%s: %d steps; the property does not exercise it", c.name, c.n)
		}
	}
}

// A request that fits a hole a cancel left departs in it, before the
// key's slot, without moving the TAT; the hole is used up.
func TestStepTakesAHoleWithoutMovingTheTAT(t *testing.T) {
	k := &Kernel{Interval: 10, Tau: 10, MaxWait: 1000}
	now := 1000.0
	s := Cold
	var tats []float64
	for range 3 { // departures at 1000, 1010, 1020
		st := step(k, Key{TAT: s, Floor: now}, now, 1)
		s = st.TAT
		tats = append(tats, st.TAT)
	}
	l := k.NewLedger(s, now) // the first give-back makes the Ledger
	s = l.Cancel(k, s, 1010, 1, 0, tats[1], now)
	if len(l.Holes) != 1 || l.Holes[0].At != 1010 {
		t.Fatalf("cancelling the middle reservation left holes %+v, want one at 1010", l.Holes)
	}
	st := step(k, Key{TAT: s, Ledger: l, Floor: now}, now, 1)
	if !st.Allowed || st.At != 1010 || st.Moved || st.TAT != s || st.Seq == 0 || st.Ledger != l {
		t.Fatalf("Step = %+v, want the hole at 1010, the TAT %v unchanged, a sequence number", st, s)
	}
	if len(l.Holes) != 0 {
		t.Fatalf("holes after the take: %+v", l.Holes)
	}
	next := step(k, Key{TAT: s, Ledger: l, Floor: now}, now, 1)
	if want := s + k.Interval - k.Tau; !next.Moved || next.At != want || next.Seq != st.Seq+1 {
		t.Fatalf("the request after it: %+v, want the key's slot at %v", next, want)
	}
}

// step is Kernel.Step returning its outcome.
func step(k *Kernel, key Key, now float64, cost int64) Step {
	var out Step
	k.Step(&key, now, cost, &out)
	return out
}
