package memstore

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// A store full of idle keys takes every new key, by evicting an idle one
// from anywhere in the store: idle is the normal state between sweeps. With
// WithMaxKeys(100) and 100 keys idle for 60 ms, a new key used to be refused
// within 5-20 tries ("no key is idle") while Sweep would have evicted 80-95.
func TestMaxKeysEvictsAnIdleKeyFromAnywhere(t *testing.T) {
	t.Parallel()
	clock := newFakeAt(t0)
	store := New(WithMaxKeys(100), WithSweepInterval(0))
	s, err := shaper.New(store, shaper.PerSecond(1000), shaper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		mustReserve(t, s, "old"+strconv.Itoa(i), 1)
	}
	clock.Advance(60 * time.Millisecond)
	for i := range 1000 {
		if _, err := s.Reserve(bg, "new"+strconv.Itoa(i), 1); err != nil {
			t.Fatalf("new key %d at the cap with idle keys in the store: %v", i, err)
		}
		if store.Len() > 100 {
			t.Fatalf("Len %d over the cap of 100", store.Len())
		}
		clock.Advance(2 * time.Millisecond) // each new key is idle 1 ms after it is made
	}
}

// The cap holds under concurrency and counts pause records: 8 goroutines
// making new keys and new pauses at once on a store whose every key is
// throttled never take it over the cap (it used to reach 101 with a cap of
// 100, and 300,000 pauses with a cap of 1,000 added 17.9 MiB while Len said
// 0). Exactly the free places are taken; the rest get ErrFull.
func TestMaxKeysIsNeverExceeded(t *testing.T) {
	t.Parallel()
	clock := newFakeAt(t0)
	store := New(WithMaxKeys(100), WithSweepInterval(0))
	s, err := shaper.New(store, shaper.PerMinute(1), shaper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	var took, full atomic.Int64
	var over atomic.Bool
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				key := strconv.Itoa(g) + ":" + strconv.Itoa(i)
				var err error
				if i%2 == 0 {
					_, err = s.Reserve(bg, key, 1)
				} else {
					err = s.Pause(bg, key, time.Hour)
				}
				switch {
				case err == nil:
					took.Add(1)
				case errors.Is(err, ErrFull):
					full.Add(1)
				default:
					t.Error(err)
				}
				if store.Len() > 100 {
					over.Store(true)
				}
			}
		})
	}
	wg.Wait()
	if over.Load() || store.Len() != 100 || took.Load() != 100 || full.Load() != 8000-100 {
		t.Fatalf("cap 100: Len %d (over at some point: %v), %d entries taken, %d refused", store.Len(), over.Load(), took.Load(), full.Load())
	}
	// Once the pauses end and the keys go idle, the places are taken again.
	clock.Advance(2 * time.Hour)
	for i := range 300 {
		if err := s.Pause(bg, "later"+strconv.Itoa(i), time.Second); err != nil {
			t.Fatalf("pause %d after the others ended: %v", i, err)
		}
		clock.Advance(1001 * time.Millisecond)
		if store.Len() > 100 {
			t.Fatalf("Len %d over the cap", store.Len())
		}
	}
}

// Refusing a new key when nothing is idle touches no entry: the earliest
// idle instant is ahead, so no key can be idle, and the answer needs no
// scan (it used to scan every shard under a lock: 25-30 ms per refused key
// with 1,000,000 keys, and other keys stalled 40-126 ms).
func TestMaxKeysRefusesWithoutAScan(t *testing.T) {
	t.Parallel()
	clock := newFakeAt(t0)
	store := New(WithMaxKeys(10000), WithSweepInterval(0))
	s, err := shaper.New(store, shaper.PerMinute(1), shaper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		mustReserve(t, s, strconv.Itoa(i), 1)
	}
	store.m.capMu.Lock()
	before := len(store.m.capH)
	head := store.m.capH[0]
	store.m.capMu.Unlock()
	for i := range 1000 {
		if _, err := s.Reserve(bg, "new"+strconv.Itoa(i), 1); !errors.Is(err, ErrFull) {
			t.Fatalf("new key %d with every key throttled: %v", i, err)
		}
	}
	store.m.capMu.Lock()
	defer store.m.capMu.Unlock()
	if len(store.m.capH) != before || store.m.capH[0] != head {
		t.Fatalf("refusals changed the idle index: %d records -> %d", before, len(store.m.capH))
	}
}
