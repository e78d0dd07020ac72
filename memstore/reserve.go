package memstore

import (
	"context"
	"slices"
	"strings"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// ReserveOne is the single-key branch of a shaper of one contract: one
// transition on one key, for an admissible cost, the decision returned by
// value. The leaky bucket and GCRA (k: the kernel of d's leaky bucket or
// of its Allow form, within the caller's deadline) keep a bare TAT per
// key: the store finds the key, the kernel steps it (gcra.Kernel.Step:
// schedule, Ledger, floor and clamp), and the store keeps the result. The
// grant carries the stored TAT as its tag, its generation (see
// tatKeys.grant), its sequence number in the key's Ledger (0 without one)
// and its departure. The other algorithms run their transition on the
// key's State (reserveState).
func (m *mem) ReserveOne(d *store.Dim, allow bool, key string, cost int64, now, limit float64) (algorithms.Decision, store.Grant, error) {
	k := d.Kern
	if allow {
		k = d.KernAllow
	}
	if k == nil {
		alg := d.Alg
		if allow {
			alg = d.Allow
		}
		return m.reserveState(d, alg, key, cost, now)
	}
	var within gcra.Kernel
	k = store.Within(k, limit, &within)
	sh, sp := m.enter(nsOf(d), key, now)
	defer sh.mu.Unlock()
	t := &sp.tats
	i, exists := t.index[key]
	in := gcra.Key{TAT: gcra.Cold, Floor: sp.floor(key, now), Clamped: sp.clamped(key, now)}
	if exists {
		in.TAT, in.Ledger = t.at(i, k, now), t.ledger(i)
	}
	var step gcra.Step
	k.Step(&in, now, cost, &step)
	if !step.Allowed {
		return algorithms.Decision{RetryAfter: algorithms.Duration(step.Wait)}, store.Grant{}, nil
	}
	g := store.Grant{Tag: step.TAT, Seq: step.Seq, At: step.At}
	switch {
	case !exists:
		if !m.claim(sh, now) {
			return algorithms.Decision{}, store.Grant{}, ErrFull
		}
		kc := strings.Clone(key) // do not pin the caller's buffer
		i = t.add(kc, step.TAT, k)
		m.track(nsOf(d), kc, step.TAT, false)
		g.Gen = t.grant(i)
	case step.Moved:
		t.set(i, step.TAT, k)
		t.setLedger(i, step.Ledger)
		g.Gen = t.grant(i)
	default: // a hole taken: the key's schedule is as it was
		g.Gen = t.gens[i] &^ hasLedger
	}
	if sp.clamps != nil {
		sp.advance(key, now, step.At)
	}
	return algorithms.Decision{Allowed: true, Delay: algorithms.Duration(step.Wait), Remaining: step.Remaining}, g, nil
}

// reserveState is ReserveOne for the algorithms other than the GCRA family.
func (m *mem) reserveState(d *store.Dim, alg algorithms.Algorithm, key string, cost int64, now float64) (algorithms.Decision, store.Grant, error) {
	sh, sp := m.enter(nsOf(d), key, now)
	defer sh.mu.Unlock()
	st, exists := sp.states.states[key]
	next, res, err := algorithms.ReserveNotBefore(alg, st, now, sp.floor(key, now), cost)
	if err != nil || !res.Allowed {
		return res, store.Grant{}, err
	}
	switch {
	case !exists:
		if !m.claim(sh, now) {
			return algorithms.Decision{}, store.Grant{}, ErrFull
		}
		k := strings.Clone(key)
		sp.states.states[k] = next
		m.trackState(sp, nsOf(d), k, next, now)
	case len(next) != len(st) || &next[0] != &st[0]:
		sp.states.states[key] = next
	}
	at := now + res.Wait() // now, for an algorithm that does not queue
	sp.advance(key, now, at)
	if res.Remaining > 1 && sp.clamped(key, now) {
		res.Remaining = 1
	}
	return res, store.Grant{Tag: next[0], At: at}, nil
}

// Seed raises key's TAT in d's space to at least tat (the GCRA family
// only): redisstore keeps its FailLocal twin's schedule level with
// Redis's. A new key that does not fit under MaxKeys is not seeded.
func (m *mem) Seed(d *store.Dim, key string, tat, now float64) {
	sh, sp := m.enter(nsOf(d), key, now)
	defer sh.mu.Unlock()
	t := &sp.tats
	if t.index == nil {
		return
	}
	if i, ok := t.index[key]; ok {
		if tat > t.at(i, d.Kern, now) {
			t.set(i, tat, d.Kern)
		}
		return
	}
	if m.claim(sh, now) {
		k := strings.Clone(key)
		_ = t.add(k, tat, d.Kern)
		m.track(nsOf(d), k, tat, false)
	}
}

// lockAll locks the shards of keys in index order (so that concurrent
// multi-key transitions cannot deadlock). It returns each key's shard, and
// the distinct shards it locked, for unlockAll.
// perKey and locked are appended to (pass the caller's buffers, so that a
// request of a few dimensions allocates nothing here).
func (m *mem) lockAll(dims []*store.Dim, keys []string, perKey, locked []*memShard) ([]*memShard, []*memShard) {
	var buf [4]int
	idx := buf[:0]
	for i := range keys {
		j := m.shardIndex(nsOf(dims[i]), keys[i])
		idx = append(idx, j)
		perKey = append(perKey, &m.shards[j])
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	for _, j := range idx {
		sh := &m.shards[j]
		sh.mu.Lock()
		locked = append(locked, sh)
	}
	return perKey, locked
}

func unlockAll(shards []*memShard) {
	for _, sh := range shards {
		sh.mu.Unlock()
	}
}

// Reserve runs one transition over one key per dimension with all their
// shards locked: every dimension commits, or none.
func (m *mem) Reserve(_ context.Context, req *store.Request) error {
	var shardBuf, lockedBuf, spaceBuf = [4]*memShard{}, [4]*memShard{}, [4]*memSpace{}
	var dimBuf [4]algorithms.Dim
	shards, locked := m.lockAll(req.Dims, req.Keys, shardBuf[:0], lockedBuf[:0])
	defer unlockAll(locked)
	n := len(req.Dims)
	dims, spaces := dimBuf[:0], spaceBuf[:0]
	for range n {
		dims, spaces = append(dims, algorithms.Dim{}), append(spaces, nil)
	}
	floor, fresh := req.Now, 0
	for i, d := range req.Dims {
		sh := shards[i]
		sp := m.space(sh, nsOf(d))
		spaces[i] = sp
		sh.high = max(sh.high, req.Now)
		floor = max(floor, sp.floor(req.Keys[i], req.Now))
		st, exists := sp.getAt(req.Keys[i], d.Kern, req.Now)
		if !exists {
			fresh++
		}
		dims[i] = algorithms.Dim{Alg: req.Algs[i], State: st, Cost: req.Costs[i]}
	}
	// Places under the cap are claimed before the transition, which may
	// write existing keys' states in place. No shard is passed as held: an
	// eviction may not touch the shards locked here, so it can never take
	// one of this request's own keys.
	for c := range fresh {
		if !m.claim(nil, req.Now) {
			for range c {
				m.unclaim()
			}
			return ErrFull
		}
	}
	var dec algorithms.AllDecision
	var err error
	if req.Any {
		dec, err = algorithms.AnyWithin(dims, req.Now, floor, req.Limit)
	} else {
		dec, err = algorithms.AllWithin(dims, req.Now, floor, req.Limit)
	}
	req.Dec = dec
	if err != nil || !dec.Allowed {
		for range fresh {
			m.unclaim()
		}
		if err != nil && dec.Binding >= 0 && dec.Binding < n {
			return store.NameCost(err, req.Dims[dec.Binding], req.Keys[dec.Binding])
		}
		return err
	}
	req.Tags, req.Gens, req.Seqs = req.Tags[:0], req.Gens[:0], req.Seqs[:0] // newMulti's arrays: no allocation up to four dimensions
	req.At, req.Decided = req.Now+dec.Wait, req.Now
	for i, d := range req.Dims {
		if dec.Took&(1<<i) == 0 { // Any: a dimension that did not admit is untouched
			if _, exists := spaces[i].keys.get(req.Keys[i]); !exists {
				m.unclaim()
			}
			req.Tags, req.Gens, req.Seqs = append(req.Tags, 0), append(req.Gens, 0), append(req.Seqs, 0)
			continue
		}
		spaces[i].advance(req.Keys[i], req.Now, req.At)
		if req.Dec.Remaining > 1 && spaces[i].clamped(req.Keys[i], req.Now) { // one request a slot (see clamped)
			req.Dec.Remaining = 1
		}
		stored, isNew, gen := spaces[i].keys.put(req.Keys[i], dims[i].State)
		if isNew {
			m.trackState(spaces[i], nsOf(d), stored, dims[i].State, req.Now)
		}
		if t := &spaces[i].tats; t.index != nil && d.Kern != nil { // stored under d's contract
			t.under[t.index[req.Keys[i]]] = t.contract(d.Kern)
		}
		seq := 0.0
		if t := &spaces[i].tats; t.index != nil && !isNew { // a key of the GCRA family with a Ledger records its departure
			j := t.index[req.Keys[i]]
			if l := t.ledger(j); l != nil && l.Fits(d.Kern) {
				seq = l.Grant(d.Kern, req.At, req.Costs[i])
			} else if l != nil { // made under another contract (changed live): dropped
				t.setLedger(j, nil)
			}
		}
		req.Tags, req.Gens, req.Seqs = append(req.Tags, dims[i].State[0]), append(req.Gens, gen), append(req.Seqs, seq)
	}
	return nil
}

// trackState records a state just added under key (the store's own copy)
// at the instant it becomes idle (see track); without a cap it does nothing.
func (m *mem) trackState(sp *memSpace, ns uint32, key string, st algorithms.State, now float64) {
	if m.maxKeys == 0 {
		return
	}
	_, reset := sp.alg.Status(st, now)
	m.track(ns, key, now+reset, false)
}
