package storetest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/fair"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// oddFlows are flow names with what a store could mistake: the empty name,
// spaces, braces, colons, a backslash, non-ASCII, field-like names.
var oddFlows = []string{"", "a", "b c", "{t}", "x:y", `z\`, "клиент", "v", "f1", "m", "g0 a", " "}

// fairWeights and fairCosts span the bounds: MinWeight and MaxWeight, and a
// cost of 10,000 at MinWeight, whose finish tag (1e10) once drowned the
// steps of MaxWeight flows in a float64.
var (
	fairWeights = []float64{1, 3, 0.5, 0.1, 7.25, 1e-6, 1e6, 1e5}
	fairCosts   = []float64{1, 2, 3, 5, 0, 10000}
)

// FairTurns sends the same seeded sequences of fair turns to c's store and
// to a memory store, on the client clock (ms given with each call), and
// fails t at the first reply that differs: whether granted, the flow, the
// start and finish tags and V (both halves), bit for bit, and Renewed.
// Three owners (processes) register flows of several classes with random
// weights and costs (the bounds among them), one name in several classes,
// update, leave and end on their last request; some calls hold or start
// fresh; time jumps past the TTLs; MaxRun varies; one sequence registers
// hundreds of flows at once. Keys are OddKeys under the prefix
// "fair<seed>-<c.Name>:".
func FairTurns(t *testing.T, c Candidate) {
	t.Helper()
	run := func(st store.Backend, seed uint64) []string {
		rng := rand.New(rand.NewPCG(seed, 7))
		base := fmt.Sprintf("fair%d-%s:", seed, c.Name)
		now := float64(T0.UnixMilli())
		owners := []string{"p1", "p2", "q3"}
		var out []string
		for step := range 400 {
			key := OddKeys[rng.IntN(len(OddKeys))*rng.IntN(2)] // half the first
			who := owners[rng.IntN(len(owners))*rng.IntN(2)]
			tr := &store.Turns{Base: base, Key: key, Slot: key, Owner: who}
			now += float64(rng.IntN(60)) + float64(rng.IntN(1000))/1000
			if rng.IntN(40) == 0 { // past every TTL
				now += 700
			}
			p := fair.Params{Now: now, TTL: float64(50 + rng.IntN(500)), MaxRun: rng.IntN(4), Fresh: rng.IntN(30) == 0, Hold: rng.IntN(15) == 0}
			var ups []fair.Update
			used := map[string]bool{}
			n := rng.IntN(4)
			if seed == 3 && step%100 == 0 { // hundreds of flows at once
				n = fair.MaxUpdates
			}
			for range n {
				name := oddFlows[rng.IntN(len(oddFlows))]
				if n > 8 {
					name = fmt.Sprint("t", rng.IntN(1000))
				}
				prio := rng.IntN(3) - 1
				if rng.IntN(20) == 0 {
					prio = []int{-100, 100, 7}[rng.IntN(3)]
				}
				id := fmt.Sprint(prio, " ", name)
				if used[id] {
					continue
				}
				used[id] = true
				ups = append(ups, fair.Update{
					Name:     name,
					Priority: prio,
					Weight:   fairWeights[rng.IntN(len(fairWeights))],
					Cost:     fairCosts[rng.IntN(len(fairCosts))*rng.IntN(2)],
					Last:     rng.IntN(5) == 0,
					Leave:    rng.IntN(8) == 0,
				})
			}
			reply, err := st.Turn(bg, tr, p, ups)
			line := fmt.Sprintf("%d %q %s %+v %v: ", step, key, who, p, ups)
			if err != nil {
				line += ErrText(err)
			} else {
				line += fmt.Sprintf("granted %v %q %d start %v finish %v V %v renewed %v", reply.Granted, reply.Name, reply.Priority, reply.Start, reply.Finish, reply.V, reply.Renewed)
			}
			out = append(out, line)
		}
		return out
	}
	for seed := range uint64(4) {
		want := run(store.Of(memory()), seed)
		granted, refused := 0, 0
		for _, l := range want {
			switch {
			case strings.Contains(l, "granted true"):
				granted++
			case strings.Contains(l, "granted false"):
				refused++
			}
		}
		if granted < 30 || refused < 30 {
			t.Fatalf("seed %d: %d turns granted, %d not of %d: the sequence does not exercise both", seed, granted, refused, len(want))
		}
		Same(t, fmt.Sprintf("fair turns on %s, seed %d", c.Name, seed), "memory", want, run(store.Of(c.New()), seed))
	}
}

// FairLoneOwner checks on c's store that an owner alone on a key is
// granted every turn it asks for while it has a flow registered (and does
// not hold), whatever it registered, updated, left or let expire before:
// 40 flows in three classes (more than a process once put forward, with a
// lower class waiting), on the client clock, under the prefix
// "lone-<c.Name>:" (issue 37: the store owed the turn to a flow the
// process had not put forward, and told it another process had it).
func FairLoneOwner(t *testing.T, c Candidate) {
	t.Helper()
	st := store.Of(c.New())
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 11))
		tr := &store.Turns{Base: fmt.Sprintf("lone%d-%s:", seed, c.Name), Key: "k", Slot: "k", Owner: "solo"}
		now := float64(T0.UnixMilli())
		registered := map[string]bool{}
		granted := 0
		for step := range 300 {
			now += float64(rng.IntN(40))
			if rng.IntN(50) == 0 { // past the TTL: the key forgets the owner
				now += 1000
			}
			p := fair.Params{Now: now, TTL: 200, MaxRun: 1 + rng.IntN(9), Fresh: rng.IntN(40) == 0, Hold: rng.IntN(20) == 0}
			var ups []fair.Update
			used := map[string]bool{}
			for range rng.IntN(6) {
				u := fair.Update{Name: fmt.Sprint("t", rng.IntN(40)), Priority: rng.IntN(3) - 1, Weight: fairWeights[rng.IntN(len(fairWeights))],
					Cost: fairCosts[rng.IntN(4)], Last: rng.IntN(5) == 0, Leave: rng.IntN(6) == 0}
				id := fmt.Sprint(u.Priority, " ", u.Name)
				if !used[id] {
					used[id] = true
					ups = append(ups, u)
				}
			}
			reply, err := st.Turn(bg, tr, p, ups)
			if err != nil {
				t.Fatalf("%s, seed %d, step %d: %v", c.Name, seed, step, err)
			}
			if reply.Renewed || p.Fresh {
				clear(registered)
			}
			for _, u := range ups {
				registered[fmt.Sprint(u.Priority, " ", u.Name)] = !u.Leave
			}
			waits := false
			for _, ok := range registered {
				waits = waits || ok
			}
			if waits && !p.Hold && !reply.Granted {
				t.Fatalf("%s, seed %d, step %d: an owner alone, with flows registered, was refused the turn: %+v %v", c.Name, seed, step, p, ups)
			}
			if reply.Granted {
				granted++
				id := fmt.Sprint(reply.Priority, " ", reply.Name)
				if !registered[id] {
					t.Fatalf("%s, seed %d, step %d: granted %s, which it had not registered", c.Name, seed, step, id)
				}
				for _, u := range ups {
					if fmt.Sprint(u.Priority, " ", u.Name) == id && u.Last {
						registered[id] = false
					}
				}
			}
		}
		if granted < 100 {
			t.Fatalf("%s, seed %d: %d turns granted of 300: the sequence does not exercise it", c.Name, seed, granted)
		}
	}
}

// FairDeadOwner checks on c's store that an owner that stops calling (a
// process that died, or a ghost written with the longest TTL) holds the
// turn no longer than its TTL, at most fair.MaxTTL: another owner asking
// every second is refused until then and granted after, under the prefix
// "dead-<c.Name>:".
func FairDeadOwner(t *testing.T, c Candidate) {
	t.Helper()
	st := store.Of(c.New())
	base := "dead-" + c.Name + ":"
	now := float64(T0.UnixMilli())
	dead := &store.Turns{Base: base, Key: "k", Slot: "k", Owner: "dead"}
	live := &store.Turns{Base: base, Key: "k", Slot: "k", Owner: "live"}
	if r, err := st.Turn(bg, dead, fair.Params{Now: now, TTL: fair.MaxTTL}, []fair.Update{{Name: "ghost", Priority: 100, Weight: 1, Cost: 1}}); err != nil || !r.Granted {
		t.Fatalf("%s: the first owner's turn: %+v %v", c.Name, r, err)
	}
	ups := []fair.Update{{Name: "a", Weight: 1, Cost: 1}}
	for at := now + 1000; at <= now+fair.MaxTTL+1000; at += 1000 {
		r, err := st.Turn(bg, live, fair.Params{Now: at, TTL: 1500}, ups)
		ups = nil
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if want := at > now+fair.MaxTTL; r.Granted != want {
			t.Fatalf("%s: %v ms after the first owner's last call, granted %v, want %v", c.Name, at-now, r.Granted, want)
		}
	}
}
