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
// spaces, braces, colons, a backslash, non-ASCII, a field-like "v".
var oddFlows = []string{"", "a", "b c", "{t}", "x:y", `z\`, "клиент", "v", "f1"}

// FairTurns sends the same seeded sequences of fair turns to c's store and
// to a memory store, on the client clock (ms given with each call), and
// fails t at the first reply that differs: the granted candidate, the
// start tag, V and every finish tag, bit for bit. Candidates have random
// weights, classes and costs, leave and say they are last, time jumps past
// the TTLs, and MaxRun varies, on OddKeys under the prefix "fair<seed>-<c.Name>:".
func FairTurns(t *testing.T, c Candidate) {
	t.Helper()
	run := func(st store.Backend, seed uint64) []string {
		rng := rand.New(rand.NewPCG(seed, 7))
		base := fmt.Sprintf("fair%d-%s:", seed, c.Name)
		now := float64(T0.UnixMilli())
		var out []string
		for step := range 300 {
			key := OddKeys[rng.IntN(len(OddKeys))*rng.IntN(2)] // half the first

			tr := &store.Turns{Base: base, Key: key, Slot: key}
			now += float64(rng.IntN(60)) + float64(rng.IntN(1000))/1000
			if rng.IntN(40) == 0 { // past every TTL
				now += 700
			}
			p := fair.Params{Now: now, TTL: float64(50 + rng.IntN(500)), MaxRun: rng.IntN(4)}
			var cands []fair.Cand
			used := map[string]bool{}
			for range 1 + rng.IntN(4) {
				name := oddFlows[rng.IntN(len(oddFlows))]
				if used[name] {
					continue
				}
				used[name] = true
				cands = append(cands, fair.Cand{
					Name:     name,
					Weight:   []float64{1, 3, 0.5, 0.1, 7.25}[rng.IntN(5)],
					Priority: rng.IntN(3) - 1,
					Cost:     float64(1 + rng.IntN(5)),
					Last:     rng.IntN(5) == 0,
					Leave:    rng.IntN(8) == 0,
				})
			}
			reply, err := st.Turn(bg, tr, p, cands)
			line := fmt.Sprintf("%d %q %v: ", step, key, cands)
			if err != nil {
				line += ErrText(err)
			} else {
				line += fmt.Sprintf("granted %d start %v V %v finish %v seq %v", reply.Granted, reply.Start, reply.V, reply.Finish, reply.Seq)
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
			case strings.Contains(l, "granted -1"):
				refused++
			case strings.Contains(l, "granted"):
				granted++
			}
		}
		if granted < 30 || refused < 30 {
			t.Fatalf("seed %d: %d turns granted, %d refused of %d: the sequence does not exercise both", seed, granted, refused, len(want))
		}
		Same(t, fmt.Sprintf("fair turns on %s, seed %d", c.Name, seed), "memory", want, run(store.Of(c.New()), seed))
	}
}
