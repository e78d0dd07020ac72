package fair

import (
	"math"
	"testing"
)

// backlogged asks for turns for every flow at once, as one process with
// all of them waiting, n times, and returns the cost served per flow.
func backlogged(s *State, p Params, flows []Cand, n int, cost func(i int) float64) map[string]float64 {
	served := map[string]float64{}
	for i := range n {
		cands := make([]Cand, len(flows))
		for j, f := range flows {
			f.Cost = cost(i + j)
			cands[j] = f
		}
		r := s.Turn(p, cands)
		if r.Granted < 0 {
			panic("a process holding every flow was refused a turn")
		}
		served[cands[r.Granted].Name] += cands[r.Granted].Cost
		p.Now++
	}
	return served
}

// Flows that stay backlogged receive service in proportion to their
// weights, within SFQ's bound at every step: |W_i/w_i - W_j/w_j| <=
// cmax/w_i + cmax/w_j.
func TestSharesFollowWeightsWithinTheBound(t *testing.T) {
	s := &State{}
	flows := []Cand{{Name: "a", Weight: 1}, {Name: "b", Weight: 2}, {Name: "c", Weight: 5}}
	cost := func(i int) float64 { return float64(1 + i*7%3) } // 1..3
	p := Params{Now: 1, TTL: 10}
	served := map[string]float64{}
	for step := range 5000 {
		got := backlogged(s, p, flows, 1, func(int) float64 { return cost(step) })
		for k, v := range got {
			served[k] += v
		}
		p.Now++
		for _, a := range flows {
			for _, b := range flows {
				d := math.Abs(served[a.Name]/a.Weight - served[b.Name]/b.Weight)
				if bound := 3/a.Weight + 3/b.Weight; d > bound+1e-9 {
					t.Fatalf("step %d: %s and %s apart by %v, bound %v (%v)", step, a.Name, b.Name, d, bound, served)
				}
			}
		}
	}
}

// A flow that arrives starts at V: its first request goes before the
// second of a flow that was waiting, whatever that flow's backlog.
func TestALateFlowStartsAtV(t *testing.T) {
	s := &State{}
	p := Params{Now: 1, TTL: 10}
	backlogged(s, p, []Cand{{Name: "a", Weight: 1}}, 1000, func(int) float64 { return 1 })
	p.Now = 1005 // a still waits (its TTL runs to 1009)
	order := ""
	for range 6 {
		r := s.Turn(p, []Cand{{Name: "a", Weight: 1, Cost: 1}, {Name: "b", Weight: 1, Cost: 1}})
		order += []string{"a", "b"}[r.Granted]
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
		s := &State{}
		p := Params{Now: 1, TTL: 10, MaxRun: maxRun}
		got := backlogged(s, p, []Cand{{Name: "batch", Weight: 100, Priority: -1}, {Name: "chat", Weight: 1, Priority: 1}}, 1000, func(int) float64 { return 1 })
		want := 0.0
		if maxRun > 0 {
			want = 1000 / float64(maxRun+1)
		}
		if math.Abs(got["batch"]-want) > 1 {
			t.Fatalf("MaxRun %d: batch served %v of 1000, want %v", maxRun, got["batch"], want)
		}
	}
}

// With three classes waiting, the lower two share the turns the rule
// against starvation gives: neither starves behind the other.
func TestEveryLowerClassHasItsTurn(t *testing.T) {
	s := &State{}
	p := Params{Now: 1, TTL: 10, MaxRun: 9}
	got := backlogged(s, p, []Cand{{Name: "chat", Weight: 1, Priority: 1}, {Name: "normal", Weight: 1}, {Name: "batch", Weight: 1, Priority: -1}}, 1000, func(int) float64 { return 1 })
	if got["chat"] != 900 || got["normal"] != 50 || got["batch"] != 50 {
		t.Fatalf("served %v of 1000: want chat 900, and 50 each for the two lower classes", got)
	}
}

// Another process's flow, best placed, holds the turn until its TTL
// passes, and a leaving flow at once; a flow granted as Last stops
// waiting.
func TestTurnsAcrossProcesses(t *testing.T) {
	s := &State{}
	p := Params{Now: 100, TTL: 50}
	if r := s.Turn(p, []Cand{{Name: "b", Weight: 1, Cost: 1}}); r.Granted != 0 {
		t.Fatalf("b alone: %+v", r)
	}
	p.Now++
	// b (tag 1) waits in process 2; a (tag V=0) in process 1 goes first.
	if r := s.Turn(p, []Cand{{Name: "a", Weight: 1, Cost: 1}}); r.Granted != 0 {
		t.Fatalf("a, new: %+v", r)
	}
	p.Now++
	if r := s.Turn(p, []Cand{{Name: "a", Weight: 1, Cost: 1}}); r.Granted != -1 {
		t.Fatalf("a after one turn, b waiting with the same tag but served earlier... %+v", r)
	}
	p.Now += 60 // b's TTL passes: it stopped waiting
	if r := s.Turn(p, []Cand{{Name: "a", Weight: 1, Cost: 1}}); r.Granted != 0 {
		t.Fatalf("a after b's TTL: %+v", r)
	}
	if r := s.Turn(p, []Cand{{Name: "b", Weight: 1, Cost: 1}}); r.Granted != 0 {
		t.Fatalf("b back: %+v", r)
	}
	if r := s.Turn(p, []Cand{{Name: "b", Weight: 1, Cost: 1}}); r.Granted != -1 {
		t.Fatalf("b again, while a waits with the same start tag, served less recently: %+v", r)
	}
	s.Turn(p, []Cand{{Name: "a", Leave: true}})
	if r := s.Turn(p, []Cand{{Name: "b", Weight: 1, Cost: 1, Last: true}}); r.Granted != 0 {
		t.Fatalf("b once a left: %+v", r)
	}
	if s.Active(p.Now) {
		t.Fatalf("b granted as Last still waits: %+v", s.Flows["b"])
	}
}

// FuzzTurn drives a State with random calls and checks, at every call,
// what Turn promises: V never decreases while a flow waits; the turn goes only to a waiting
// candidate, and to the best waiting flow by priority and start tag (or,
// under the rule against starvation, the best of a lower class); its finish
// is its start plus cost/weight; the reply's tags are the state's.
func FuzzTurn(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	f.Add([]byte{0xff, 0, 0x80, 3, 9, 27, 81, 243, 1, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &State{}
		names := []string{"a", "b", "c", "d"}
		now := 0.0
		for len(data) >= 3 {
			op, x, y := data[0], data[1], data[2]
			data = data[3:]
			now += float64(x % 40)
			p := Params{Now: now, TTL: float64(10 + y%90), MaxRun: int(op % 4)}
			var cands []Cand
			for i, n := range names {
				if x>>i&1 == 0 {
					continue
				}
				cands = append(cands, Cand{Name: n, Weight: []float64{1, 2, 0.5, 3}[(int(y)+i)%4], Priority: int(op>>(2+i)&1) - int(y>>i&1), Cost: float64(1 + (int(op)+i)%3), Last: y>>(4+i)&1 == 1 && i%2 == 0, Leave: op>>(4+i)&3 == 3})
			}
			// What the state says before the call, for the check: nothing
			// when nobody waits (the key starts over).
			v0 := 0.0
			before := map[string]Flow{}
			if s.Active(now) {
				v0 = s.V
				for n, fl := range s.Flows {
					before[n] = *fl
				}
			}
			r := s.Turn(p, cands)
			if s.V < v0 {
				t.Fatalf("V went back from %v to %v", v0, s.V)
			}
			if r.Granted < 0 {
				continue
			}
			c := cands[r.Granted]
			if c.Leave {
				t.Fatalf("a leaving candidate was granted: %+v", c)
			}
			fl := s.Flows[c.Name]
			if fl == nil && !c.Last {
				t.Fatalf("the granted flow %q is gone", c.Name)
			}
			prev, seen := before[c.Name]
			start := v0
			if seen && prev.Finish > start {
				start = prev.Finish
			}
			if r.Start != start || s.V != start {
				t.Fatalf("granted %q started at %v (V %v), want max(V, F) = %v", c.Name, r.Start, s.V, start)
			}
			if fl != nil && fl.Finish != start+c.Cost/c.Weight {
				t.Fatalf("granted %q finishes at %v, want %v", c.Name, fl.Finish, start+c.Cost/c.Weight)
			}
			// No waiting flow of a higher class, nor of its class with a
			// lower start tag, unless a lower class took its due turn
			// (which of them, TestEveryLowerClassHasItsTurn).
			starved := false
			for n, g := range s.Flows {
				if n != c.Name && g.Until >= now && g.Priority > c.Priority {
					starved = true
				}
			}
			if starved && p.MaxRun == 0 {
				t.Fatalf("%q (class %d) granted while a higher class waits, strict priority", c.Name, c.Priority)
			}
			for n, g := range s.Flows {
				if n == c.Name || g.Until < now {
					continue
				}
				gs := math.Max(v0, g.Finish)
				if !starved && g.Priority == c.Priority && gs < start {
					t.Fatalf("%q (start %v) granted while %q (start %v) of its class waits", c.Name, start, n, gs)
				}
			}
			for i, cd := range cands {
				if g := s.Flows[cd.Name]; g != nil && r.Finish[i] != g.Finish {
					t.Fatalf("reply finish %v for %q, state %v", r.Finish[i], cd.Name, g.Finish)
				}
			}
		}
	})
}

// Once nobody waits, the key starts over: the next flow starts at V = 0,
// whatever was served before (a store may have let the key expire).
func TestTheKeyStartsOverOnceNobodyWaits(t *testing.T) {
	s := &State{}
	p := Params{Now: 1, TTL: 10}
	backlogged(s, p, []Cand{{Name: "a", Weight: 1}}, 50, func(int) float64 { return 1 })
	if s.V == 0 {
		t.Fatal("V did not move")
	}
	p.Now = 100 // a's TTL has passed
	r := s.Turn(p, []Cand{{Name: "b", Weight: 1, Cost: 1}})
	if r.Granted != 0 || r.Start != 0 || s.V != 0 || len(s.Flows) != 1 {
		t.Fatalf("after everyone stopped waiting: %+v, state %+v", r, s)
	}
}
