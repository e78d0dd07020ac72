package memstore

import (
	"cmp"
	"context"
	"math"
	"strings"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// each runs f on every (dimension, key) pair with the key's shard locked.
func (m *mem) each(ks store.KeySet, f func(sh *memShard, sp *memSpace, d *store.Dim, i int)) {
	for i, d := range ks.Dims {
		sh := m.shard(nsOf(d), ks.Keys[i])
		sh.mu.Lock()
		f(sh, m.space(sh, nsOf(d)), d, i)
		sh.mu.Unlock()
	}
}

// Settle gives back, per key of the GCRA family, what the reservation did
// not use. A key without a Ledger refunds only the tail of its schedule
// (its TAT and generation both match the reservation's; the generation is
// bumped, so that a copy of the reservation refunds nothing) and gets a
// Ledger; a key with one follows its rule (gcra.Ledger).
func (m *mem) Settle(_ context.Context, st *store.Settlement) error {
	keys := st.Keys
	var err error
	m.each(st.KeySet, func(sh *memShard, sp *memSpace, d *store.Dim, i int) {
		t := &sp.tats
		extra := st.Actual != nil && st.Actual[i] > st.Costs[i]
		if d.Kern == nil || t.index == nil { // the other algorithms: an extra is charged now; a log gives back, the rest nothing
			if !extra {
				if gb, ok := d.Alg.(algorithms.GiveBacker); ok {
					if cur, ok := sp.states.states[keys[i]]; ok {
						used := int64(0) // cancelled
						if st.Actual != nil {
							used = max(st.Actual[i], 0)
						}
						sp.states.states[keys[i]] = gb.GiveBack(cur, st.Now, st.At, st.Costs[i]-used)
					}
				}
				return
			}
			if cur, ok := sp.states.states[keys[i]]; ok {
				sp.states.states[keys[i]] = d.Alg.Commit(cur, st.Now, 0, st.Actual[i]-st.Costs[i])
			} else if m.claim(sh, st.Now) { // evicted, cold: the extra is charged on a cold state
				k := strings.Clone(keys[i])
				next := d.Alg.Commit(nil, st.Now, 0, st.Actual[i]-st.Costs[i])
				sp.states.states[k] = next
				m.trackState(sp, nsOf(d), k, next, st.Now)
			} else {
				err = ErrFull
			}
			return
		}
		j, ok := t.index[keys[i]]
		if !ok { // evicted: cold, nothing to give back; an extra is still charged
			if extra {
				err = cmp.Or(err, m.chargeCold(sh, sp, d, keys[i], st, i))
			}
			return
		}
		before := t.slab[j]
		l := t.ledger(j)
		gen := t.gens[j] &^ hasLedger
		cur := t.at(j, d.Kern, st.Now) // as the reservation's contract reads it
		if cur == gcra.Cold {          // reset while its reservations could still settle: read as now, as Redis reads a TAT key gone
			cur = st.Now
		}
		s, l := settleTAT(d.Kern, cur, l, &gen, st, i)
		if s != cur { // unchanged, it stays as stored (under the contract that stored it), as on Redis
			t.set(j, s, d.Kern)
		}
		t.gens[j] = t.gens[j]&hasLedger | gen
		t.setLedger(j, l)
		if t.slab[j] < before {
			m.track(nsOf(d), strings.Clone(keys[i]), t.slab[j], false) // idle earlier than recorded
		}
	})
	if st.Actual == nil { // a cancel gives back the clamp's slot it was the last to move
		m.each(st.KeySet, func(_ *memShard, sp *memSpace, d *store.Dim, i int) {
			if d.Kern == nil { // the GCRA family's keys only, as lua/settle.lua, which settles no other
				return
			}
			if c, ok := sp.clamps[keys[i]]; ok && st.Now < c.end && c.next == st.At+c.interval {
				c.next = st.At
				sp.clamps[keys[i]] = c
			}
		})
	}
	return err
}

// chargeCold charges the extra of a settle on a key of the GCRA family that
// was evicted: every departure it held was at or before the key went cold,
// so at most now, and the extra raises their terms: the key's TAT becomes
// now + T*(actual - cost) (gcra.Kernel.ChargeCold). A Ledger records the
// reservation as settled, so that a copy of it charges nothing. The caller
// holds the key's shard.
func (m *mem) chargeCold(sh *memShard, sp *memSpace, d *store.Dim, key string, st *store.Settlement, i int) error {
	if !m.claim(sh, st.Now) {
		return ErrFull
	}
	t := &sp.tats
	s := d.Kern.ChargeCold(st.Now, st.Costs[i], st.Actual[i])
	k := strings.Clone(key)
	j := t.add(k, s, d.Kern)
	m.track(nsOf(d), k, s, false)
	l := d.Kern.NewLedger(s, st.Now)
	if st.Seqs[i] == 0 {
		l.Claim(st.Tags[i])
	}
	t.setLedger(j, l)
	return nil
}

// settleTAT is the rule of settle for one key whose TAT is s, Ledger l
// (nil: none yet) and generation *gen (the local twins of a Redis store
// follow it too). It returns the TAT to store and the key's Ledger.
func settleTAT(k *gcra.Kernel, s float64, l *gcra.Ledger, gen *uint32, st *store.Settlement, i int) (float64, *gcra.Ledger) {
	actual := int64(0)
	if st.Actual != nil {
		actual = st.Actual[i]
	}
	if l != nil && !l.Fits(k) || st.Seqs[i] < 0 { // another contract's Ledger, or a slot granted under another contract: an extra is charged, nothing given back
		s = k.Charge(s, st.Costs[i], actual)
		if l != nil && l.Fits(k) { // the key's own Ledger counts the extra all the same
			l.Overran(k, st.At, st.Costs[i], actual, s, st.Now)
		}
		return s, l
	}
	if l == nil {
		if st.Seqs[i] == 0 && *gen == st.Gens[i] && s == st.Tags[i] {
			// The tail: all of it comes back (an extra is charged), and a
			// Ledger begins, which counts the extra in the holes the
			// reservations granted before it may leave.
			s = k.SettleTail(s, st.At, st.Costs[i], actual)
			*gen = (*gen + 1) &^ hasLedger
			l = k.NewLedger(s, st.Now)
			l.Claim(st.Tags[i])
			l.Overran(k, st.At, st.Costs[i], actual, s, st.Now)
			return s, l
		}
		l = k.NewLedger(s, st.Now)
	}
	if st.Actual == nil && st.Holes {
		return l.Cancel(k, s, st.At, st.Costs[i], st.Seqs[i], st.Tags[i], st.Now), l
	}
	return l.Settle(k, s, st.At, st.Costs[i], actual, st.Seqs[i], st.Tags[i], st.Now), l
}

// Pause records a pause per key; a new pause record is an entry under
// MaxKeys like a state. At the cap with nothing idle to evict it fails with
// ErrFull (the dimensions before it stay paused: a pause only holds
// departures back).
func (m *mem) Pause(_ context.Context, ks store.KeySet, now, d float64) error {
	until, keys := now+d, ks.Keys
	var err error
	m.each(ks, func(sh *memShard, sp *memSpace, dm *store.Dim, i int) {
		if err != nil {
			return
		}
		if p, ok := sp.paused[keys[i]]; ok {
			if until > p {
				sp.paused[keys[i]] = until
			}
			return
		}
		if !m.claim(sh, now) {
			err = ErrFull
			return
		}
		if sp.paused == nil {
			sp.paused = map[string]float64{}
		}
		k := strings.Clone(keys[i])
		sp.paused[k] = until
		m.track(nsOf(dm), k, until, true)
	})
	return err
}

func (m *mem) Reset(_ context.Context, ks store.KeySet, now float64) error {
	m.reset(ks, now, false)
	return nil
}

// reset is Reset; with learning the partners' clamps and pauses stay (a
// learning key's Reset, store.LearnOp.Reset). A key of the GCRA family whose
// reservations may still be given back stays, cold (gcra.Cold, which
// Settle reads as now, as Redis reads a TAT key gone), with the Ledger
// that gives them nothing back (gcra.Kernel.ResetLedger; lua/ledger.lua's
// reset).
func (m *mem) reset(ks store.KeySet, now float64, learning bool) {
	keys := ks.Keys
	m.each(ks, func(_ *memShard, sp *memSpace, d *store.Dim, i int) {
		t := &sp.tats
		if j, ok := t.index[keys[i]]; ok && d.Kern != nil {
			if l := d.Kern.ResetLedger(t.ledger(j), t.at(j, d.Kern, now), now); l != nil {
				t.set(j, gcra.Cold, d.Kern)
				t.setLedger(j, l)
			} else if sp.keys.remove(keys[i]) {
				m.keys.Add(-1)
			}
		} else if sp.keys.remove(keys[i]) {
			m.keys.Add(-1)
		}
		if learning {
			return
		}
		if _, ok := sp.paused[keys[i]]; ok {
			delete(sp.paused, keys[i])
			m.keys.Add(-1)
		}
		delete(sp.clamps, keys[i])
	})
}

// Clamp sets a partner's clamp on every key (see Shaper.Clamp). It
// replaces a clamp in force whose next slot has not come by holding that
// slot (or its reset, whichever is sooner), but no later than the new
// interval after the departure before it: the partner's count is spread
// from the key's next slot on, never from a whole new interval after a
// departure another clamp (a spacing margin) spaced (lua/lib.lua's
// set_clamp, mode 'spread').
func (m *mem) Clamp(_ context.Context, ks store.KeySet, now, interval, span float64, keepTighter bool) error {
	m.clamp(ks, now, interval, span, keepTighter, true)
	return nil
}

// clamp is Clamp with spread; without it, the next slot of a clamp in
// force moves to the new interval after the departure before it, sooner
// or later (a learned rate's clamp, a margin), even past its window (a
// slot granted ahead before a shorter MaxQueue), and a window that would
// end before that slot's interval is over ends a span after it instead:
// a pace renewed never forgets the departure it spaces from. With tighter
// and spread (Clamp's keepTighter, a pause's resumed pace) the two clamps
// merge: the one spacing departures further apart holds, until the later
// of the two ends, so that a shorter pause never shortens the pace a
// longer one set. With tighter alone (store.LearnClamp.Tighter, a
// margin renewed every MarginSpan/2), a key whose clamp in force spaces
// departures further than interval apart keeps it, to its own end; one
// exactly as far apart, a margin's own, is renewed.
func (m *mem) clamp(ks store.KeySet, now, interval, span float64, tighter, spread bool) {
	keys := ks.Keys
	m.each(ks, func(_ *memShard, sp *memSpace, _ *store.Dim, i int) {
		next, end := now, now+span
		c, ok := sp.clamps[keys[i]]
		if ok && tighter && now < c.end {
			switch {
			case spread && c.interval >= interval: // merged: the tighter one stays, to the later end
				if end > c.end {
					sp.clamps[keys[i]] = clampState{next: c.next, interval: c.interval, end: end}
				}
				return
			case spread: // merged: the new, tighter one, to the later end
				end = max(end, c.end)
			case c.interval > interval:
				return
			}
		}
		switch {
		case !ok || now >= c.end || c.next <= now:
		case spread: // its hold kept, to the new interval after the departure before it at most
			next = max(now, min(c.next, c.end, c.next-c.interval+interval))
		default: // its next slot moved to the new interval, its window past it
			next = max(now, c.next-c.interval+interval)
			if next+interval > end {
				end = next + span
			}
		}
		if sp.clamps == nil {
			sp.clamps = map[string]clampState{}
		}
		sp.clamps[strings.Clone(keys[i])] = clampState{next: next, interval: interval, end: end}
	})
}

// Status reads every key with all their shards locked, so that the figures
// are one instant's, as a reservation would see them; the partners' clamps
// in force on the keys then bound them (clampFigures, as lua/status.lua).
func (m *mem) Status(_ context.Context, q *store.Query) error {
	var shardBuf, lockedBuf [4]*memShard
	shards, locked := m.lockAll(q.Dims, q.Keys, shardBuf[:0], lockedBuf[:0])
	defer unlockAll(locked)
	dims := make([]algorithms.Dim, len(q.Dims))
	ends := make([]float64, len(q.Dims)) // the reset of the clamp in force on each key; 0: none
	q.Until = q.Now
	for i, d := range q.Dims {
		sp := m.space(shards[i], nsOf(d))
		q.Until = max(q.Until, sp.floor(q.Keys[i], q.Now))
		if c, ok := sp.clamps[q.Keys[i]]; ok && q.Now < c.end {
			ends[i] = c.end
		}
		st, _ := sp.getAt(q.Keys[i], d.Kern, q.Now)
		dims[i] = algorithms.Dim{Alg: q.Algs[i], State: st, Cost: q.Costs[i]}
	}
	q.At = q.Now
	q.Figures = make([]algorithms.Standing, len(dims))
	if q.Any {
		q.Binding = algorithms.PeekAny(dims, q.Now, q.Until, q.Figures)
	} else {
		q.Binding = algorithms.Peek(dims, q.Now, q.Until, q.Figures)
	}
	clampFigures(q.Figures, q.Costs, ends, q.Now, q.Until, q.Any)
	return nil
}

func (m *mem) PauseLeft(_ context.Context, ks store.KeySet, now float64) (float64, error) {
	left, keys := 0.0, ks.Keys
	m.each(ks, func(_ *memShard, sp *memSpace, _ *store.Dim, i int) {
		if p, ok := sp.paused[keys[i]]; ok {
			left = max(left, p-now)
		}
	})
	return left, nil
}

// clampFigures bounds the figures of a status read at now by the partners'
// clamps in force on its keys (see Status), as lua/status.lua does, bit
// for bit. ends[i] is the reset of the clamp holding dimension i's key (0:
// none); until is the store's floor (the latest pause's end or clamp's
// slot; now when none). A clamped key is not cold before its reset. A
// request that departs on a clamped key before its reset moves the clamp's
// next slot past now, so no second one departs at once: then every
// dimension the request departs on has at most 1 remaining (when the slot
// comes is the floor's business). A request departs on every dimension of
// its cost; under Any, only on those whose delay is within its wait, the
// later of the soonest delay and the floor (algorithms.AnyWithin commits
// those alone, and moves only their clamps).
func clampFigures(figs []algorithms.Standing, costs []int64, ends []float64, now, until float64, anyMode bool) {
	wait := math.Inf(1) // every dimension of the request departs
	if anyMode {
		for i, c := range costs {
			if c != 0 && figs[i].Delay < wait {
				wait = figs[i].Delay
			}
		}
		if until-now > wait {
			wait = until - now
		}
	}
	held := false
	for i, end := range ends {
		if end == 0 {
			continue
		}
		if r := end - now; r > figs[i].Reset {
			figs[i].Reset = r
		}
		if costs[i] != 0 && figs[i].Delay <= wait {
			held = true
		}
	}
	if !held {
		return
	}
	for i, c := range costs {
		if c != 0 && figs[i].Delay <= wait && figs[i].Remaining > 1 {
			figs[i].Remaining = 1
		}
	}
}
