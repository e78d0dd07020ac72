package memstore

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// The single-key step of the GCRA family used to be two paths in the store
// (reserveTAT, and ledgered for a key with a Ledger); it is now one call of
// gcra.Kernel.Step. oldReserveOne below is the store's step before the
// redesign (git show HEAD:shaper/memory.go, reserveTAT and ledgered, and the
// deadline of shaper.reserveOne), ported to the new types and otherwise
// unchanged. TestReserveTATMatchesTheOldTwoPathStep drives random sequences
// of reservations (Reserve and Allow, with and without a deadline),
// cancels, settles, pauses, clamps, live contract changes, resets and
// sweeps through two stores, one on each step, and requires the same
// decision, grant and error at every step and the same stored key after it.
// Both stores share Settle, Pause and Clamp: the test pins the step alone.

// oldPath counts the branches of the old step a run went through, so that
// the test can tell it exercised each.
type oldPath struct {
	noLedger, refused, newKey, full  int
	hole, ledgerSlot, freshLedger    int
	otherContractTake, droppedLedger int
	floored, clamped                 int
}

// oldReserveOne is the old shaper.reserveOne's store call for the GCRA
// family: the caller's deadline first, then the old step.
func (m *mem) oldReserveOne(d *store.Dim, allow bool, key string, cost int64, now, limit float64, p *oldPath) (algorithms.Decision, store.Grant, error) {
	k := d.Kern
	if allow {
		k = d.KernAllow
	}
	var within gcra.Kernel
	if k != nil && limit < k.MaxWait { // the caller's deadline comes first: the kernel waits no longer
		within = *k
		within.MaxWait = max(limit, 0)
		k = &within
	}
	var dec algorithms.Decision
	tag, gen, seq, at, err := m.oldReserveTAT(d, k, key, cost, now, &dec, p)
	return dec, store.Grant{Tag: tag, Gen: gen, Seq: seq, At: at}, err
}

// oldReserveTAT is the old MemoryStore.reserveTAT.
func (m *mem) oldReserveTAT(d *store.Dim, k *gcra.Kernel, key string, cost int64, now float64, dec *algorithms.Decision, p *oldPath) (tag float64, gen uint32, seq, at float64, err error) {
	sh, sp := m.enter(nsOf(d), key, now)
	defer sh.mu.Unlock()
	if sp.floor(key, now) > now {
		p.floored++
	}
	if sp.clamped(key, now) {
		p.clamped++
	}
	t := &sp.tats
	i, exists := t.index[key]
	tat := gcra.Cold
	if exists {
		tat = t.at(i, k, now)
		if t.gens[i]&hasLedger != 0 {
			return m.oldLedgered(sp, i, k, key, cost, now, dec, p)
		}
	}
	p.noLedger++
	next, wait, allowed := k.Reserve(tat, now, sp.floor(key, now), cost)
	if !allowed { // *dec is the caller's zero Decision: set what differs
		p.refused++
		dec.RetryAfter = algorithms.Duration(wait)
		return 0, 0, 0, 0, nil
	}
	dec.Allowed, dec.Delay, dec.Remaining = true, algorithms.Duration(wait), k.Remaining(next, now)
	if exists {
		t.set(i, next, k)
	} else {
		p.newKey++
		if !m.claim(sh, now) {
			p.full++
			*dec = algorithms.Decision{}
			return 0, 0, 0, 0, ErrFull
		}
		kc := strings.Clone(key) // do not pin the caller's buffer
		i = t.add(kc, next, k)
		m.track(nsOf(d), kc, next, false)
	}
	if sp.clamps != nil {
		sp.advance(key, now, now+wait)
		if dec.Remaining > 1 && sp.clamped(key, now) {
			dec.Remaining = 1
		}
	}
	return next, t.grant(i), 0, now + wait, nil
}

// oldLedgered is the old MemoryStore.ledgered: reserveTAT on a key with a
// Ledger.
func (m *mem) oldLedgered(sp *memSpace, i uint32, k *gcra.Kernel, key string, cost int64, now float64, dec *algorithms.Decision, p *oldPath) (tag float64, gen uint32, seq, at float64, err error) {
	t := &sp.tats
	tat, l := t.at(i, k, now), t.ledger(i)
	floor := sp.floor(key, now)
	next, wait, allowed := k.Reserve(tat, now, floor, cost)
	before := math.Inf(1)
	if allowed {
		before = now + wait
	}
	fits := l.Fits(k) // a Ledger made under another contract (changed live) is not used
	if fits {
		if at, seq, ok := l.Take(k, now, floor, before, cost); ok {
			p.hole++
			dec.Allowed, dec.Delay, dec.Remaining = true, algorithms.Duration(at-now), k.Remaining(tat, now)
			sp.advance(key, now, at)
			if dec.Remaining > 1 && sp.clamped(key, now) {
				dec.Remaining = 1
			}
			return tat, t.gens[i] &^ hasLedger, seq, at, nil
		}
	} else {
		p.otherContractTake++
	}
	if !allowed {
		p.refused++
		dec.RetryAfter = algorithms.Duration(wait)
		return 0, 0, 0, 0, nil
	}
	dec.Allowed, dec.Delay, dec.Remaining = true, algorithms.Duration(wait), k.Remaining(next, now)
	t.set(i, next, k)
	sp.advance(key, now, now+wait)
	if dec.Remaining > 1 && sp.clamped(key, now) {
		dec.Remaining = 1
	}
	switch {
	case l.Idle(tat, now): // cold, no hole ahead: a fresh Ledger, whose steps know every departure
		p.freshLedger++
		l = k.RenewLedger(l, tat, now)
		t.setLedger(i, l)
	case !fits: // busy under another contract: the key goes on without one
		p.droppedLedger++
		t.setLedger(i, nil)
		return next, t.grant(i), 0, now + wait, nil
	}
	p.ledgerSlot++
	return next, t.grant(i), l.Grant(k, now+wait, cost), now + wait, nil
}

// keyView is everything a store holds for one key of one namespace: its
// TAT slot (as stored, with the contract it was stored under), generation,
// Ledger, pause and clamp.
type keyView struct {
	Exists   bool
	TAT      float64
	Under    [2]float64
	Gen      uint32
	Ledger   *gcra.Ledger
	Paused   float64
	HasPause bool
	Clamp    clampState
	HasClamp bool
}

func (m *mem) view(d *store.Dim, key string) keyView {
	sh := m.shard(nsOf(d), key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sp := m.space(sh, nsOf(d))
	var v keyView
	t := &sp.tats
	if i, ok := t.index[key]; ok {
		v.Exists, v.TAT, v.Gen, v.Ledger = true, t.slab[i], t.gens[i], t.ledger(i)
		if u := t.under[i]; u != 0 {
			v.Under = t.contracts[u]
		}
	}
	v.Paused, v.HasPause = sp.paused[key]
	v.Clamp, v.HasClamp = sp.clamps[key]
	return v
}

// heldGrant is one reservation as its caller holds it.
type heldGrant struct {
	g        store.Grant
	cost     int64
	key      string
	contract int // the index of the contract it was granted under
}

// stepPair is the two stores under comparison, with the same dimensions.
type stepPair struct {
	newM, oldM *mem
	newD, oldD [2]*store.Dim // per contract: A and B (the contract changed live)
}

func stepDim(t *testing.T, r algorithms.Rate, maxQueue time.Duration) *store.Dim {
	t.Helper()
	alg, err := algorithms.NewLeakyBucket(r, maxQueue)
	if err != nil {
		t.Fatal(err)
	}
	allow, err := algorithms.NewGCRA(r)
	if err != nil {
		t.Fatal(err)
	}
	d := &store.Dim{Prefix: "p:", Base: "p:", Identity: "leaky", Alg: alg, Allow: allow}
	d.SetKernels()
	return d
}

// pairFor binds contract A on two fresh stores, and B as A's live change.
func pairFor(t *testing.T, rng *rand.Rand, maxKeys int) *stepPair {
	t.Helper()
	rate := func() (algorithms.Rate, time.Duration) {
		r := algorithms.Rate{Count: float64(1 + rng.IntN(20)), Period: time.Duration(1+rng.IntN(10)) * 100 * time.Millisecond, Burst: int64(1 + rng.IntN(12))}
		return r, time.Duration(rng.IntN(5000)) * time.Millisecond
	}
	ra, qa := rate()
	rb, qb := rate()
	p := &stepPair{}
	for _, side := range []struct {
		m  **mem
		ds *[2]*store.Dim
	}{{&p.newM, &p.newD}, {&p.oldM, &p.oldD}} {
		s := New(WithSweepInterval(0), WithMaxKeys(maxKeys))
		*side.m = s.m
		a, b := stepDim(t, ra, qa), stepDim(t, rb, qb)
		bound, err := s.m.Bind(a)
		if err != nil {
			t.Fatal(err)
		}
		a.Bound, b.Bound = bound, bound
		*side.ds = [2]*store.Dim{a, b}
	}
	// The same shards: keys that share a slab in one store share it in the
	// other, so that freed slots are reused alike.
	p.oldM.seed = p.newM.seed
	return p
}

func TestReserveTATMatchesTheOldTwoPathStep(t *testing.T) {
	t.Parallel()
	seeds := 300
	if testing.Short() {
		seeds = 100
	}
	var p oldPath
	var steps int
	for seed := range uint64(seeds) {
		steps += runStepPair(t, seed, &p)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d reservations; old branches: %+v", steps, p)
	for name, n := range map[string]int{
		"key without a Ledger": p.noLedger, "refused": p.refused, "new key": p.newKey, "ErrFull": p.full,
		"hole taken": p.hole, "slot recorded in a Ledger": p.ledgerSlot, "cold key, fresh Ledger": p.freshLedger,
		"Ledger under another contract": p.otherContractTake, "Ledger dropped": p.droppedLedger,
		"floor after now": p.floored, "clamped": p.clamped,
	} {
		if n < 10 {
			t.Errorf("the branch %q ran %d times: the comparison does not exercise it", name, n)
		}
	}
}

// runStepPair runs one random sequence and returns how many reservations it
// compared.
func runStepPair(t *testing.T, seed uint64, p *oldPath) int {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	maxKeys := 0
	if seed%4 == 0 {
		maxKeys = 2 // two keys, and pauses count: some new keys are refused
	}
	pair := pairFor(t, rng, maxKeys)
	keys := []string{"a", "b"}
	now := algorithms.Millis(t0)
	cur := 0 // the contract in force
	var all []*heldGrant
	var trail []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d, after:\n  %s\n%s", seed, strings.Join(trail, "\n  "), fmt.Sprintf(format, args...))
	}
	both := func(f func(m *mem, ds [2]*store.Dim) error) {
		t.Helper()
		errNew, errOld := f(pair.newM, pair.newD), f(pair.oldM, pair.oldD)
		if errNew != errOld {
			fail("errors differ: new %v, old %v", errNew, errOld)
		}
	}
	compared := 0
	for range 250 {
		key := keys[0]
		if rng.IntN(5) == 0 {
			key = keys[1]
		}
		ks := func(ds [2]*store.Dim) store.KeySet {
			return store.KeySet{Dims: []*store.Dim{ds[cur]}, Keys: []string{key}, Slot: key}
		}
		switch op := rng.IntN(40); {
		case op < 14: // reserve
			allow := rng.IntN(4) == 0
			limit := store.NoLimit
			if rng.IntN(4) == 0 {
				limit = float64(rng.IntN(3000))
			}
			k := pair.newD[cur].Kern
			if allow {
				k = pair.newD[cur].KernAllow
			}
			cost := int64(1 + rng.IntN(14))
			var within gcra.Kernel
			if !store.Within(k, limit, &within).Admissible(cost) { // shaper.reserveOne refuses it before the store
				continue
			}
			trail = append(trail, fmt.Sprintf("now %v reserve %s cost %d allow %v limit %v (contract %d)", now, key, cost, allow, limit, cur))
			decN, gN, errN := pair.newM.ReserveOne(pair.newD[cur], allow, key, cost, now, limit)
			decO, gO, errO := pair.oldM.oldReserveOne(pair.oldD[cur], allow, key, cost, now, limit, p)
			compared++
			if decN != decO || gN != gO || errN != errO {
				fail("new step: %+v %+v %v\nold step: %+v %+v %v", decN, gN, errN, decO, gO, errO)
			}
			if decN.Allowed {
				all = append(all, &heldGrant{g: gN, cost: cost, key: key, contract: cur})
			}
		case op < 20 && len(all) > 0: // cancel (sometimes a copy again)
			h := all[rng.IntN(len(all))]
			if now > h.g.At || h.key != key || h.contract != cur { // too late, or under another contract: the shaper does nothing
				continue
			}
			trail = append(trail, fmt.Sprintf("now %v cancel %+v", now, *h))
			both(func(m *mem, ds [2]*store.Dim) error {
				return m.Settle(bg, &store.Settlement{KeySet: ks(ds), Tags: []float64{h.g.Tag}, Gens: []uint32{h.g.Gen}, Seqs: []float64{h.g.Seq}, Costs: []int64{h.cost}, At: h.g.At, Now: now, Holes: true})
			})
		case op < 26 && len(all) > 0: // settle (sometimes a copy again), sometimes for more
			h := all[rng.IntN(len(all))]
			if h.key != key {
				continue
			}
			actual := rng.Int64N(h.cost + 3)
			seq := h.g.Seq
			if h.contract != cur { // shaper: granted under a contract changed since
				if actual <= h.cost {
					continue
				}
				seq = -1
			}
			trail = append(trail, fmt.Sprintf("now %v settle %+v actual %d", now, *h, actual))
			both(func(m *mem, ds [2]*store.Dim) error {
				return m.Settle(bg, &store.Settlement{KeySet: ks(ds), Tags: []float64{h.g.Tag}, Gens: []uint32{h.g.Gen}, Seqs: []float64{seq}, Costs: []int64{h.cost}, Actual: []int64{actual}, At: h.g.At, Now: now, Holes: true})
			})
		case op < 28: // pause
			d := float64(rng.IntN(2000))
			trail = append(trail, fmt.Sprintf("now %v pause %s %v", now, key, d))
			both(func(m *mem, ds [2]*store.Dim) error { return m.Pause(bg, ks(ds), now, d) })
		case op < 30: // a partner's clamp
			interval, span, tighter := float64(1+rng.IntN(500)), float64(rng.IntN(3000)), rng.IntN(2) == 0
			trail = append(trail, fmt.Sprintf("now %v clamp %s %v %v tighter %v", now, key, interval, span, tighter))
			both(func(m *mem, ds [2]*store.Dim) error { return m.Clamp(bg, ks(ds), now, interval, span, tighter) })
		case op == 30: // the contract changes live
			cur = 1 - cur
			trail = append(trail, fmt.Sprintf("now %v contract %d", now, cur))
			both(func(m *mem, ds [2]*store.Dim) error { _, err := m.Rebind(ds[cur]); return err })
		case op == 31 && rng.IntN(4) == 0:
			trail = append(trail, fmt.Sprintf("now %v reset %s", now, key))
			both(func(m *mem, ds [2]*store.Dim) error { return m.Reset(bg, ks(ds), now) })
		case op == 32:
			trail = append(trail, fmt.Sprintf("now %v sweep", now))
			if n, o := pair.newM.sweep(), pair.oldM.sweep(); n != o {
				fail("sweep evicted %d (new) and %d (old)", n, o)
			}
		default:
			now += float64(rng.IntN(400))
		}
		for _, k := range keys {
			if vn, vo := pair.newM.view(pair.newD[cur], k), pair.oldM.view(pair.oldD[cur], k); !reflect.DeepEqual(vn, vo) {
				fail("key %s differs:\nnew %+v\nold %+v", k, vn, vo)
			}
		}
		if n, o := pair.newM.keys.Load(), pair.oldM.keys.Load(); n != o {
			fail("Len %d (new) and %d (old)", n, o)
		}
		if len(trail) > 12 {
			trail = trail[1:]
		}
	}
	return compared
}
