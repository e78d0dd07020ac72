package memstore

import (
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// A reservation on an existing key allocates nothing, through the public
// path (shaper.Reserve and Allow, the store's ReserveOne): the leaky bucket
// and GCRA step a bare TAT in the slab, the token bucket writes its State
// in place; a key of the GCRA family with a Ledger (it gave back once)
// records its slots there without allocating either. The burst is large
// enough that every call is admitted.
func TestReserveOnAnExistingKeyDoesNotAllocate(t *testing.T) {
	rate := shaper.Rate{Count: 1000, Period: time.Second, Burst: 1 << 30}
	for _, c := range []struct {
		alg    shaper.Algorithm
		ledger bool
	}{{shaper.LeakyBucket, false}, {shaper.GCRA, false}, {shaper.TokenBucket, false}, {shaper.LeakyBucket, true}, {shaper.GCRA, true}} {
		name := c.alg.String()
		if c.ledger {
			name += "+ledger"
		}
		t.Run(name, func(t *testing.T) {
			s, store, _ := newTest(t, rate, shaper.WithAlgorithm(c.alg))
			defer store.Close()
			r := mustReserve(t, s, "k", 1)
			if c.ledger {
				if err := r.Settle(bg, 0); err != nil { // the key's first give-back: it has a Ledger from now on
					t.Fatal(err)
				}
				if !store.holdsLedger("k") {
					t.Fatal("no Ledger after a settle")
				}
			}
			var err error
			ok := true
			if n := testing.AllocsPerRun(1000, func() { _, err = s.Reserve(bg, "k", 1) }); n != 0 || err != nil {
				t.Errorf("%v allocations per Reserve on an existing key (err %v), want 0", n, err)
			}
			if n := testing.AllocsPerRun(1000, func() { ok, err = s.Allow(bg, "k", 1) }); n != 0 || !ok || err != nil {
				t.Errorf("%v allocations per Allow on an existing key (admitted %v, err %v), want 0", n, ok, err)
			}
			if store.Len() != 1 {
				t.Errorf("Len = %d, want the one key", store.Len())
			}
		})
	}
}

// holdsLedger reports whether key holds a Ledger in any namespace.
func (s *Store) holdsLedger(key string) bool {
	for i := range s.m.shards {
		sh := &s.m.shards[i]
		sh.mu.Lock()
		for _, sp := range sh.spaces {
			if sp == nil {
				continue
			}
			if j, ok := sp.tats.index[key]; ok && sp.tats.ledger(j) != nil {
				sh.mu.Unlock()
				return true
			}
		}
		sh.mu.Unlock()
	}
	return false
}
