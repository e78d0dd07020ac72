package algorithms_test

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/script"
)

var update = flag.Bool("update", false, "rewrite testdata/conformance.golden from the current Go math")

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// runKept runs script on keys (per dimension, its state key then its pause
// key) and, in the same MULTI, removes the TTL of the state keys. The
// timelines here are simulated: a state whose TTL is a few simulated
// milliseconds (a window about to end) would otherwise expire in real time
// before the next step, or the GET after this one, reads it. Go keeps every
// state, and the two would differ for a reason that is not the math.
// TestRedisKeysExpireWhenIdle (package shaper) covers the TTLs themselves.
// The scripts must have been loaded (loadScripts).
func runKept(ctx context.Context, c *redis.Client, sc *redis.Script, keys []string, args ...any) (any, error) {
	var ev *redis.Cmd
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ev = sc.EvalSha(ctx, p, keys, args...)
		for i := 0; i < len(keys); i += 2 {
			p.Persist(ctx, keys[i])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ev.Result()
}

// loadScripts loads the scripts runKept runs, which sends EVALSHA only.
func loadScripts(t *testing.T, c *redis.Client) {
	t.Helper()
	for _, s := range []*redis.Script{script.Reserve, script.ReserveGCRA, script.Status, script.ReserveBatch} {
		if err := s.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// configs are the conformance configurations: every algorithm, fractional
// rates, bursts, queues, calendars, and multi-dimension combinations.
func configs() [][]algorithms.Algorithm {
	r := func(count float64, period time.Duration, burst int64) algorithms.Rate {
		return algorithms.Rate{Count: count, Period: period, Burst: burst}
	}
	anchor := time.Date(2026, 1, 5, 9, 30, 0, 0, time.UTC)
	one := func(a algorithms.Algorithm) []algorithms.Algorithm { return []algorithms.Algorithm{a} }
	return [][]algorithms.Algorithm{
		one(must(algorithms.NewGCRA(r(7, 3*time.Second, 5)))),
		one(must(algorithms.NewGCRA(r(10, time.Second, 1)))),
		one(must(algorithms.NewLeakyBucket(r(7, 3*time.Second, 1), 10*time.Second))),
		one(must(algorithms.NewLeakyBucket(r(100, time.Minute, 20), 5*time.Second))),
		one(must(algorithms.NewLeakyBucket(r(3, time.Second, 2), 0))),
		one(must(algorithms.NewTokenBucket(r(7, 3*time.Second, 5)))),
		one(must(algorithms.NewTokenBucket(r(1000, time.Hour, 50)))),
		one(must(algorithms.NewFixedWindow(5, time.Second))),
		one(must(algorithms.NewFixedWindow(20, 7*time.Second))),
		one(must(algorithms.NewSlidingWindow(5, time.Second, 1))),
		one(must(algorithms.NewSlidingWindow(12, 3*time.Second, 7))),
		one(must(algorithms.NewSlidingWindow(30, time.Minute, 60))),
		one(must(algorithms.NewSlidingLog(5, time.Second))),
		one(must(algorithms.NewSlidingLog(9, 2500*time.Millisecond))),
		one(must(algorithms.NewQuota(40, algorithms.Daily(14*time.Hour)))),
		one(must(algorithms.NewQuota(40, algorithms.Weekly(-12*time.Hour, time.Monday)))),
		one(must(algorithms.NewQuota(60, algorithms.Monthly(5*time.Hour+30*time.Minute)))),
		one(must(algorithms.NewQuota(8, algorithms.Fixed(3*time.Second, anchor)))),
		one(must(algorithms.NewQuota(8, algorithms.Rolling(4*time.Second, 4)))),
		one(must(algorithms.NewTokenBucket(r(3, time.Second, 3)))), // credit: exact on the grid of whole ms
		{must(algorithms.NewLeakyBucket(r(60, time.Minute, 1), 20*time.Second)), must(algorithms.NewLeakyBucket(r(1000, time.Minute, 100), 20*time.Second))},
		{must(algorithms.NewLeakyBucket(r(7, 3*time.Second, 2), 8*time.Second)), must(algorithms.NewLeakyBucket(r(5, time.Second, 5), time.Minute))},
		{must(algorithms.NewGCRA(r(5, time.Second, 5))), must(algorithms.NewFixedWindow(12, 4*time.Second))},
		{must(algorithms.NewTokenBucket(r(4, time.Second, 4))), must(algorithms.NewSlidingLog(10, 3*time.Second)), must(algorithms.NewQuota(50, algorithms.Daily(0)))},
		{must(algorithms.NewSlidingWindow(6, 2*time.Second, 4)), must(algorithms.NewGCRA(r(2, time.Second, 3)))},
	}
}

// laterConfigs are configurations added after the transcript was first
// recorded: they run after configs' (and their "any" runs), so that the
// earlier configurations keep their seeds and transcripts.
func laterConfigs() [][]algorithms.Algorithm {
	r := func(count float64, period time.Duration, burst int64) algorithms.Rate {
		return algorithms.Rate{Count: count, Period: period, Burst: burst}
	}
	one := func(a algorithms.Algorithm) []algorithms.Algorithm { return []algorithms.Algorithm{a} }
	return [][]algorithms.Algorithm{
		one(must(algorithms.NewTrailingLog(5, time.Second, 0, 10*time.Second))),
		one(must(algorithms.NewTrailingLog(9, 2500*time.Millisecond, 40*time.Millisecond, 5*time.Second))),
		one(must(algorithms.NewTrailingLog(3, time.Second, 10*time.Millisecond, 0))),
		{must(algorithms.NewTrailingLog(10, 3*time.Second, 20*time.Millisecond, 20*time.Second)), must(algorithms.NewLeakyBucket(r(4, time.Second, 4), 20*time.Second))},
		one(must(algorithms.NewCostBucket(6, 5, time.Second, 10*time.Second))),
		one(must(algorithms.NewCostBucket(9, 7, 3*time.Second, 0))),
		{must(algorithms.NewCostBucket(12, 4, time.Second, 20*time.Second)), must(algorithms.NewTrailingLog(10, 3*time.Second, 20*time.Millisecond, 20*time.Second))},
	}
}

// timeline: seeded steps of 0-900 ms, sometimes idle gaps of hours,
// sometimes the clock set back, and costs of 1-5; then steps on a grid of
// whole milliseconds that hit window edges and expiries exactly.
type step struct {
	dt   float64
	cost int64
}

func timeline(seed uint64, n int) []step {
	rng := rand.New(rand.NewPCG(seed, 17))
	out := make([]step, n)
	for i := range out {
		if i >= 200 { // from step 200 on a grid, so that instants land exactly on window edges and expiries
			out[i].dt = []float64{0, 100, 250, 500, 1000}[rng.IntN(5)]
			out[i].cost = int64(1 + rng.IntN(5))
			continue
		}
		switch x := rng.IntN(100); {
		case x < 4:
			out[i].dt = float64(1+rng.IntN(5)) * 3600e3 * (0.5 + rng.Float64())
		case x < 9:
			out[i].dt = -float64(rng.IntN(3000)) - rng.Float64()
		default:
			out[i].dt = float64(rng.IntN(900)) + math.Round(rng.Float64()*1e3)/1e3
		}
		out[i].cost = int64(1 + rng.IntN(5))
	}
	return out
}

func fmtState(st []float64) string {
	s := make([]string, len(st))
	for i, x := range st {
		s[i] = script.Float(x)
	}
	return strings.Join(s, " ")
}

func fmtDecision(d algorithms.Decision, binding int) string {
	w, rem, reset := d.Raw()
	return fmt.Sprintf("%v %s %s %s b%d", d.Allowed, script.Float(w), script.Float(rem), script.Float(reset), binding)
}

// TestGoAndLuaAreBitIdentical runs every configuration's timeline through the
// Go transition and the Lua script (client clock) and requires the same
// decision and the same stored state, bit for bit, at every step; the
// transcript must also match testdata/conformance.golden, so that neither
// side can drift unnoticed.
func TestGoAndLuaAreBitIdentical(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	loadScripts(t, client)
	ctx := context.Background()
	t0 := algorithms.Millis(time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC))
	var transcript strings.Builder
	steps, gcraSteps, anySteps := 0, 0, 0
	type mode struct {
		algs []algorithms.Algorithm
		any  bool // AnyWithin instead of All (the multi-dimension configurations again)
	}
	var modes []mode
	for _, algs := range configs() {
		modes = append(modes, mode{algs: algs})
	}
	for _, algs := range configs() {
		if len(algs) > 1 {
			modes = append(modes, mode{algs: algs, any: true})
		}
	}
	for _, algs := range laterConfigs() {
		modes = append(modes, mode{algs: algs})
		if len(algs) > 1 {
			modes = append(modes, mode{algs: algs, any: true})
		}
	}
	for ci, m := range modes {
		algs := m.algs
		keys := make([]string, 0, 2*len(algs))
		for d := range algs {
			keys = append(keys, stateAndPause(fmt.Sprintf("conf:{%d}:%d:s", ci, d))...)
		}
		states := make([]algorithms.State, len(algs))
		now := t0
		fmt.Fprintf(&transcript, "config %d:", ci)
		if m.any {
			transcript.WriteString(" any")
		}
		for _, a := range algs {
			kind, p := a.Params()
			fmt.Fprintf(&transcript, " %s%v", kind, p)
		}
		transcript.WriteByte('\n')
		for si, s := range timeline(uint64(ci), 400) {
			if si == 200 { // the grid half starts on a whole second, so that grid steps hit period edges
				now = math.Ceil(now/1000) * 1000
			}
			now += s.dt
			dims := make([]algorithms.Dim, len(algs))
			ldims := make([]script.Dim, len(algs))
			cost := s.cost
			for _, a := range algs {
				for cost > 1 && a.ValidateCost(cost) != nil {
					cost--
				}
			}
			for d, a := range algs {
				dims[d] = algorithms.Dim{Alg: a, State: slices.Clone(states[d]), Cost: cost}
				kind, p := a.Params()
				ldims[d] = script.Dim{Kind: kind, Params: p, Cost: cost}
			}
			args := script.ReserveArgs(script.Float(now), ldims)
			if m.any {
				args = append(args, script.Any)
			}
			// Status first: it reads what Peek (PeekAny) computes, bit for bit.
			sv, err := script.Status.EvalSha(ctx, client, keys, args...).Result()
			if err != nil {
				t.Fatalf("config %d step %d: status: %v", ci, si, err)
			}
			srep, err := script.ParseStatus(sv, len(algs))
			if err != nil {
				t.Fatal(err)
			}
			peek := make([]algorithms.Standing, len(algs))
			pb := algorithms.Peek(dims, now, now, peek)
			if m.any {
				pb = algorithms.PeekAny(dims, now, now, peek)
			}
			if pb != srep.Binding || !slices.Equal(peek, srep.Dims) || srep.Now != now || srep.Until != now {
				t.Fatalf("config %d step %d: Peek binds %d %+v, the status script %+v", ci, si, pb, peek, srep)
			}
			var goDec algorithms.AllDecision
			if m.any {
				goDec, err = algorithms.AnyWithin(dims, now, now, math.Inf(1))
				anySteps++
			} else {
				goDec, err = algorithms.AllNotBefore(dims, now, now)
			}
			if err != nil {
				t.Fatalf("config %d step %d: %v", ci, si, err)
			}
			if goDec.Allowed && pb >= 0 && pb != goDec.Binding {
				t.Fatalf("config %d step %d: Peek binds %d, the decision %d", ci, si, pb, goDec.Binding)
			}
			if len(algs) == 1 { // the memory store's single-key path must agree with All
				next, d1, _ := algorithms.ReserveNotBefore(algs[0], slices.Clone(states[0]), now, now, cost)
				if d1 != goDec.Decision || (d1.Allowed && fmtState(next) != fmtState(dims[0].State)) {
					t.Fatalf("config %d step %d: ReserveNotBefore %+v differs from AllNotBefore %+v", ci, si, d1, goDec)
				}
			}
			v, err := runKept(ctx, client, script.Reserve, keys, args...)
			if err != nil {
				t.Fatalf("config %d step %d: %v", ci, si, err)
			}
			rep, err := script.ParseReserve(v, len(algs))
			if err != nil {
				t.Fatal(err)
			}
			// The batch script (the store's coalescing) runs the same
			// reservation, through Reserve's body and, for the GCRA family,
			// ReserveGCRA's, on keys of its own: the very same replies and
			// stored states.
			var batch script.Batch
			bkeys := make([]string, len(keys))
			for i, k := range keys {
				bkeys[i] = "b" + k
			}
			batch.Add(false, bkeys, args)
			kind, p := algs[0].Params()
			gcraToo := len(algs) == 1 && kind == "g"
			params := script.GCRAParams(p)
			if gcraToo {
				batch.Add(true, stateAndPause("bg"+keys[0]), script.ReserveGCRAArgs(script.Float(now), &params, cost))
			}
			bv, err := runKept(ctx, client, script.ReserveBatch, batch.Keys, batch.Argv()...)
			if err != nil {
				t.Fatalf("config %d step %d: batch: %v", ci, si, err)
			}
			items, _, err := script.SplitBatch(bv, batch.Len())
			if err != nil {
				t.Fatal(err)
			}
			if brep, err := script.ParseReserve(items[0], len(algs)); err != nil || fmt.Sprint(brep) != fmt.Sprint(rep) {
				t.Fatalf("config %d step %d: the batch's Reserve gives %+v (%v), Reserve alone %+v", ci, si, brep, err, rep)
			}
			for i := range len(algs) {
				if a, b := client.Get(ctx, bkeys[2*i]).Val(), client.Get(ctx, keys[2*i]).Val(); a != b {
					t.Fatalf("config %d step %d: the batch's Reserve stored %q, Reserve alone %q", ci, si, a, b)
				}
			}
			if gcraToo {
				// The single-dimension GCRA script: the very same reply and
				// stored state as Reserve, on keys of its own.
				gkeys := stateAndPause("g" + keys[0])
				gv, err := runKept(ctx, client, script.ReserveGCRA, gkeys, script.ReserveGCRAArgs(script.Float(now), &params, cost)...)
				if err != nil {
					t.Fatalf("config %d step %d: ReserveGCRA: %v", ci, si, err)
				}
				if fmt.Sprint(items[1]) != fmt.Sprint(gv) || client.Get(ctx, "bg"+keys[0]).Val() != client.Get(ctx, gkeys[0]).Val() {
					t.Fatalf("config %d step %d: the batch's ReserveGCRA replies %v, alone %v", ci, si, items[1], gv)
				}
				grep, err := script.ParseReserveGCRA(gv, now)
				if err != nil {
					t.Fatal(err)
				}
				gallowed, gwait, gtag, err := grep.Decide(gcra.FromParams(p), cost)
				if err != nil {
					t.Fatalf("config %d step %d: %v", ci, si, err)
				}
				if gallowed != rep.Allowed || math.Float64bits(gwait) != math.Float64bits(rep.Wait) ||
					grep.Binding != rep.Binding || grep.Now != rep.Now || (rep.Allowed && gtag != rep.Tags[0]) {
					t.Fatalf("config %d step %d: ReserveGCRA gives allowed %v wait %v (binding %d, tag %v), Reserve %+v", ci, si, gallowed, gwait, grep.Binding, gtag, rep)
				}
				gs, _ := client.Get(ctx, gkeys[0]).Result()
				rs, _ := client.Get(ctx, keys[0]).Result()
				if gs != rs {
					t.Fatalf("config %d step %d: ReserveGCRA stored %q, Reserve %q", ci, si, gs, rs)
				}
				gcraSteps++
			}
			luaDec := algorithms.MakeDecision(rep.Allowed, rep.Wait, rep.Remaining, rep.Reset)
			if luaDec != goDec.Decision || rep.Binding != goDec.Binding || rep.Now != now || rep.Took != goDec.Took {
				t.Fatalf("config %d step %d (now %v, cost %d): Go %+v binding %d, Lua %+v binding %d (raw %+v)",
					ci, si, script.Float(now), cost, goDec.Decision, goDec.Binding, luaDec, rep.Binding, rep)
			}
			transcript.WriteString(fmt.Sprintf("%d %s c%d %s |", si, script.Float(now-t0), cost, fmtDecision(goDec.Decision, goDec.Binding)))
			if m.any {
				transcript.WriteString(fmt.Sprintf(" took %b |", goDec.Took))
			}
			for d := range algs {
				took := goDec.Took&(1<<d) != 0
				if took {
					states[d] = dims[d].State
				}
				stored, err := client.Get(ctx, keys[2*d]).Result()
				if err != nil && states[d] != nil {
					t.Fatalf("config %d step %d: GET %s: %v", ci, si, keys[2*d], err)
				}
				if _, isGCRA := algs[d].(*algorithms.GCRA); isGCRA && stored != "" {
					stored = gcraTAT(t, stored) // "tat interval tau": the contract it was stored under aside
				}
				luaState, err := script.DecodeState(stored)
				if err != nil {
					t.Fatal(err)
				}
				if fmtState(luaState) != fmtState(states[d]) {
					t.Fatalf("config %d step %d dim %d: Go state %q, Lua state %q", ci, si, d, fmtState(states[d]), stored)
				}
				if took && rep.Tags[d] != states[d][0] {
					t.Fatalf("config %d step %d dim %d: tag %v, state[0] %v", ci, si, d, rep.Tags[d], states[d][0])
				}
				transcript.WriteString(" " + fmtState(states[d]) + " |")
			}
			transcript.WriteByte('\n')
			steps++
		}
		if err := client.Del(ctx, keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if len(configs()) < 20 || steps < 20*400 || gcraSteps != 5*400 || anySteps < 5*400 {
		t.Fatalf("only %d configurations, %d steps, %d through ReserveGCRA, %d any", len(configs()), steps, gcraSteps, anySteps)
	}
	const golden = "testdata/conformance.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(transcript.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./algorithms -run BitIdentical -update to create it)", err)
	}
	if got := transcript.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("the transcript drifted from %s at line %d:\n got %s\nwant %s", golden, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("the transcript has %d lines, %s has %d", len(gl), golden, len(wl))
	}
}

// ReserveGCRA honours a pause exactly as Reserve does: with pause keys set
// (some in the past, some ahead of the schedule, some behind it) on both key
// sets, the two scripts give the same replies and stored states, and the
// pause binds (binding -1) in some steps and not in others.
func TestReserveGCRAMatchesReserveUnderPauses(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	loadScripts(t, client)
	ctx := context.Background()
	g := must(algorithms.NewLeakyBucket(algorithms.Rate{Count: 7, Period: 3 * time.Second, Burst: 2}, 10*time.Second)) // TTLs of 0.4 s and more
	kind, p := g.Params()
	params := script.GCRAParams(p)
	keys, gkeys := stateAndPause("r:{k}"), stateAndPause("g:{k}")
	rng := rand.New(rand.NewPCG(9, 9))
	now := algorithms.Millis(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	floored := 0
	for i := range 600 {
		now += float64(rng.IntN(15000))
		if rng.IntN(8) == 0 {
			until := script.Float(now + float64(rng.IntN(80000)-10000))
			for _, k := range []string{keys[1], gkeys[1]} {
				if err := client.Set(ctx, k, until, time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		cost := int64(1 + rng.IntN(3))
		v, err := runKept(ctx, client, script.Reserve, keys, script.ReserveArgs(script.Float(now), []script.Dim{{Kind: kind, Params: p, Cost: cost}})...)
		if err != nil {
			t.Fatal(err)
		}
		gv, err := runKept(ctx, client, script.ReserveGCRA, gkeys, script.ReserveGCRAArgs(script.Float(now), &params, cost)...)
		if err != nil {
			t.Fatal(err)
		}
		rep := must(script.ParseReserve(v, 1))
		grep := must(script.ParseReserveGCRA(gv, now))
		gallowed, gwait, gtag, err := grep.Decide(gcra.FromParams(p), cost)
		if err != nil || gallowed != rep.Allowed || math.Float64bits(gwait) != math.Float64bits(rep.Wait) || grep.Binding != rep.Binding || (rep.Allowed && gtag != rep.Tags[0]) {
			t.Fatalf("step %d: ReserveGCRA gives allowed %v wait %v (binding %d, tag %v, %v), Reserve %+v", i, gallowed, gwait, grep.Binding, gtag, err, rep)
		}
		if rep.Binding == -1 {
			floored++
		}
		if gs, rs := client.Get(ctx, gkeys[0]).Val(), client.Get(ctx, keys[0]).Val(); gs != rs {
			t.Fatalf("step %d: ReserveGCRA stored %q, Reserve %q", i, gs, rs)
		}
	}
	t.Logf("the pause bound in %d of 600 steps", floored)
	if floored < 20 || floored > 580 {
		t.Fatalf("the pause bound in %d of 600 steps: the test does not exercise both cases", floored)
	}
}

// With the server's clock, the now ParseReserveGCRA rebuilds from TIME is the
// script's own: on a cold key every new TAT is now + T, and the TAT Decide
// computes is the TAT the script stored, bit for bit, call after call. (Each
// call takes a key of its own at 1/s, so that the state lives a second: a
// key that drains between calls would expire as fast, and a GET could miss
// it on a loaded machine.)
func TestReserveGCRAServerClockNowIsTheScripts(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	g := must(algorithms.NewLeakyBucket(algorithms.Rate{Count: 1, Period: time.Second, Burst: 1}, time.Second))
	_, p := g.Params()
	params := script.GCRAParams(p)
	prev := 0.0
	for i := range 300 {
		keys := stateAndPause(fmt.Sprintf("s:{%d}", i))
		v, err := script.ReserveGCRA.Run(ctx, client, keys, script.ReserveGCRAArgs(script.ServerTime, &params, 1)...).Result()
		if err != nil {
			t.Fatal(err)
		}
		rep := must(script.ParseReserveGCRA(v, math.NaN()))
		allowed, _, tag, err := rep.Decide(gcra.FromParams(p), 1)
		if err != nil {
			t.Fatal(err)
		}
		stored := must(strconv.ParseFloat(gcraTAT(t, must(client.Get(ctx, keys[0]).Result())), 64))
		if !allowed || math.Float64bits(tag) != math.Float64bits(stored) {
			t.Fatalf("call %d: Decide's TAT %s, the script stored %s (allowed %v)", i, script.Float(tag), script.Float(stored), allowed)
		}
		if rep.Now <= prev || math.Abs(rep.Now-algorithms.Millis(time.Now())) > 5000 {
			t.Fatalf("call %d: now %s after %s: not the server's clock", i, script.Float(rep.Now), script.Float(prev))
		}
		prev = rep.Now
	}
}

// The handoff floor (ReserveGCRA's sixth argument) is applied by the script
// and by GCRAReply.Decide alike: over a random timeline with floors that
// bind and floors that do not, Decide's tag is the TAT the script stored,
// bit for bit, and its admission is the script's.
func TestReserveGCRAHandoffFloorMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	loadScripts(t, client)
	ctx := context.Background()
	g := must(algorithms.NewLeakyBucket(algorithms.Rate{Count: 5, Period: time.Second, Burst: 2}, 5*time.Second))
	_, p := g.Params()
	params := script.GCRAParams(p)
	keys := stateAndPause("h:{k}")
	rng := rand.New(rand.NewPCG(4, 2))
	now := algorithms.Millis(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	bound, refused := 0, 0
	for i := range 600 {
		now += float64(rng.IntN(900))
		floor := 0.0
		if rng.IntN(3) == 0 {
			floor = rng.Float64() * 6000
		}
		args := script.ReserveGCRAArgs(script.Float(now), &params, 1)
		if floor > 0 {
			args = append(args, script.Float(floor))
		}
		before := client.Get(ctx, keys[0]).Val()
		v, err := runKept(ctx, client, script.ReserveGCRA, keys, args...)
		if err != nil {
			t.Fatal(err)
		}
		rep := must(script.ParseReserveGCRA(v, now))
		rep.Handoff = floor
		allowed, _, tag, err := rep.Decide(gcra.FromParams(p), 1)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		stored := client.Get(ctx, keys[0]).Val()
		switch {
		case !allowed:
			refused++
			if stored != before {
				t.Fatalf("step %d: a refusal wrote %q over %q", i, stored, before)
			}
		case gcraTAT(t, stored) != script.Float(tag):
			t.Fatalf("step %d: the script stored %q, Decide computed %v", i, stored, script.Float(tag))
		}
		if floor > 0 && rep.TAT < now+floor {
			bound++
		}
	}
	t.Logf("the floor bound in %d of 600 steps; %d refused", bound, refused)
	if bound < 20 || refused < 5 {
		t.Fatalf("the floor bound in %d steps and %d were refused: the test does not exercise both", bound, refused)
	}
}

// withLedger returns the keys the scripts take for one dimension whose
// state key is k: k and its pause key.
func stateAndPause(k string) []string { return []string{k, k + ":p"} }

// gcraTAT returns the TAT of a GCRA key's stored state, "tat interval tau"
// (the contract it was stored under follows the TAT).
func gcraTAT(t *testing.T, stored string) string {
	t.Helper()
	f := strings.Fields(stored)
	if len(f) != 3 {
		t.Fatalf("a GCRA state %q, want \"tat interval tau\"", stored)
	}
	return f[0]
}
