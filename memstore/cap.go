package memstore

import "container/heap"

// The MaxKeys cap. An entry is a key's state or a key's pause store.Record, in
// one namespace; each counts once against the cap.
//
// With a cap the store keeps a min-heap of (the instant an entry becomes
// idle, the entry), pushed when the entry is created. A recorded instant is
// a lower bound of the entry's real one: a TAT and a pause's end only move
// later, and a refund, which moves a TAT earlier, pushes a fresh record. So:
//
//   - if the earliest record is still ahead, no entry anywhere is idle, and
//     a new entry at the cap is refused at once, without a scan;
//   - otherwise the due records are popped: an entry that is gone is
//     dropped, one that is idle is evicted (and the new entry takes its
//     place in the count), one that was used since is pushed again at its
//     current idle instant. Each such push is paid for by a reservation that
//     moved the entry's idle instant, so the work is amortized O(log n) per
//     reservation, and a new key at the cap costs microseconds.
//
// The count is claimed before an entry is inserted (a compare-and-swap
// below the cap, or the place of an evicted entry at it), so concurrent new
// keys never overshoot the cap.
//
// Locks: a caller holds its key's shard and then takes capMu. Under capMu a
// victim's shard is only tried (TryLock), never waited for, so the two
// orders cannot deadlock; an entry whose shard is busy at that instant is
// passed over for this eviction.

// capEntry is one record of the heap.
type capEntry struct {
	at    float64 // ms: the entry is idle from then on (a lower bound)
	ns    uint32
	pause bool // a pause store.Record, not a state
	key   string
}

type capHeap []capEntry

func (h capHeap) Len() int           { return len(h) }
func (h capHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h capHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *capHeap) Push(x any)        { *h = append(*h, x.(capEntry)) }
func (h *capHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = capEntry{} // do not pin the key
	*h = old[:len(old)-1]
	return e
}

// claim takes a place under the cap for one new entry in sh (whose lock the
// caller holds), evicting an idle entry anywhere in the store if the store
// is full. It reports whether the entry may be added. Without a cap it only
// counts.
func (m *mem) claim(sh *memShard, now float64) bool {
	if m.maxKeys == 0 {
		m.keys.Add(1)
		return true
	}
	for {
		k := m.keys.Load()
		if k >= m.maxKeys {
			return m.evictOne(sh, now) // the new entry takes the evicted one's place
		}
		if m.keys.CompareAndSwap(k, k+1) {
			return true
		}
	}
}

// unclaim gives back a place that claim took for an entry never added.
func (m *mem) unclaim() { m.keys.Add(-1) }

// track records a new entry (or a state whose idle instant moved earlier)
// in the heap; the caller holds the entry's shard lock. key must be the
// string the store keeps (a clone), so that the heap pins nothing else.
func (m *mem) track(ns uint32, key string, at float64, pause bool) {
	if m.maxKeys == 0 {
		return
	}
	m.capMu.Lock()
	heap.Push(&m.capH, capEntry{at: at, ns: ns, pause: pause, key: key})
	if len(m.capH) > 2*int(m.maxKeys)+1024 {
		m.compact()
	}
	m.capMu.Unlock()
}

// evictOne evicts one idle entry, if the heap shows one, and reports
// whether it did; held is the shard the caller has locked. The evicted
// entry's place in the count goes to the caller's new entry.
func (m *mem) evictOne(held *memShard, now float64) bool {
	m.capMu.Lock()
	defer m.capMu.Unlock()
	var busy []capEntry
	defer func() {
		for _, e := range busy {
			heap.Push(&m.capH, e)
		}
	}()
	for len(m.capH) > 0 && m.capH[0].at <= now {
		e := heap.Pop(&m.capH).(capEntry)
		sh := m.shard(e.ns, e.key)
		if sh != held && !sh.mu.TryLock() {
			busy = append(busy, e)
			continue
		}
		evicted, live, at := m.inspect(sh, e, now)
		if sh != held {
			sh.mu.Unlock()
		}
		if evicted {
			return true
		}
		if live {
			heap.Push(&m.capH, capEntry{at: at, ns: e.ns, pause: e.pause, key: e.key})
		}
	}
	return false
}

// inspect looks at the entry e records in sh (locked): it evicts it if it
// is idle at now, or reports that it lives on and when it will be idle, or
// that it is gone (neither).
func (m *mem) inspect(sh *memShard, e capEntry, now float64) (evicted, live bool, at float64) {
	if int(e.ns) >= len(sh.spaces) || sh.spaces[e.ns] == nil {
		return false, false, 0
	}
	sp := sh.spaces[e.ns]
	pauseEnd, paused := sp.paused[e.key]
	if e.pause {
		switch {
		case !paused:
			return false, false, 0
		case pauseEnd > now:
			return false, true, pauseEnd
		}
		delete(sp.paused, e.key)
		return true, false, 0
	}
	idle, ok := sp.keys.idleAt(e.key, now) // when the state is equivalent to a cold key
	if !ok {
		return false, false, 0
	}
	if paused && pauseEnd > idle { // as Sweep: a paused key keeps its state until the pause ends
		idle = pauseEnd
	}
	if idle > now {
		return false, true, idle
	}
	sp.keys.remove(e.key)
	return true, false, 0
}

// compact drops the records of entries that are gone (evicted by Sweep,
// erased by Reset), so that the heap stays near the number of entries; the
// caller holds capMu. An entry whose shard is busy keeps its record.
func (m *mem) compact() {
	kept := m.capH[:0]
	for _, e := range m.capH {
		sh := m.shard(e.ns, e.key)
		if !sh.mu.TryLock() {
			kept = append(kept, e)
			continue
		}
		if m.holds(sh, e) {
			kept = append(kept, e)
		}
		sh.mu.Unlock()
	}
	clear(m.capH[len(kept):])
	m.capH = kept
	heap.Init(&m.capH)
}

// holds reports whether the entry e records is still in sh (locked).
func (m *mem) holds(sh *memShard, e capEntry) bool {
	if int(e.ns) >= len(sh.spaces) || sh.spaces[e.ns] == nil {
		return false
	}
	sp := sh.spaces[e.ns]
	if e.pause {
		_, ok := sp.paused[e.key]
		return ok
	}
	_, ok := sp.keys.idleAt(e.key, 0)
	return ok
}
