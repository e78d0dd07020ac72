package memstore

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// 1,000,000 distinct keys touched once go idle, and the store drops to zero.
func TestMillionKeysGoIdleAndAreEvicted(t *testing.T) {
	t.Parallel()
	s, store, clock := newTest(t, shaper.PerSecond(10))
	const N = 1_000_000
	for i := range N {
		if _, err := s.Reserve(bg, "user:"+strconv.Itoa(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if store.Len() != N {
		t.Fatalf("Len = %d, want %d", store.Len(), N)
	}
	if n := store.Sweep(); n != 0 {
		t.Fatalf("swept %d keys that were still throttled", n)
	}
	clock.Advance(100 * time.Millisecond) // every key's TAT has passed...
	mustReserve(t, s, "late", 1)          // ...and the store has seen that instant
	if n := store.Sweep(); n != N {
		t.Fatalf("swept %d, want %d", n, N)
	}
	if store.Len() != 1 { // "late" is still within its interval
		t.Fatalf("Len after the sweep = %d, want 1", store.Len())
	}
}

// At the cap, a new key evicts idle keys; if none is idle it fails with
// ErrFull, and a throttled key is never dropped (its contract holds).
func TestMaxKeysNeverEvictsAThrottledKey(t *testing.T) {
	t.Parallel()
	clock := timer.NewFake(t0)
	store := New(WithMaxKeys(100), WithSweepInterval(0))
	s, err := shaper.New(store, shaper.PerSecond(1), shaper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	full := 0
	for i := range 1000 {
		_, err := s.Reserve(bg, "k"+strconv.Itoa(i), 1)
		if errors.Is(err, ErrFull) {
			full++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if store.Len() > 100 || full == 0 {
		t.Fatalf("Len %d with %d ErrFull; want at most 100 keys held and refusals", store.Len(), full)
	}
	// Every held key is still throttled: its next slot is a full interval away.
	held := 0
	for i := range 1000 {
		r, err := s.Reserve(bg, "k"+strconv.Itoa(i), 1)
		if err == nil {
			held++
			if r.Delay != time.Second {
				t.Fatalf("held key k%d: next slot %v away, want 1s (state lost?)", i, r.Delay)
			}
			_ = r.Cancel(bg)
		}
	}
	if held != store.Len() {
		t.Fatalf("%d keys answered as held, store holds %d", held, store.Len())
	}
	clock.Advance(2 * time.Second) // all idle now: new keys evict them
	if _, err := s.Reserve(bg, "new", 1); err != nil {
		t.Fatalf("a new key after the others went idle: %v", err)
	}
}

func TestBackgroundSweeperRunsAndStops(t *testing.T) {
	t.Parallel()
	clock := timer.NewFake(t0)
	store := New(WithSweepInterval(time.Millisecond))
	s, err := shaper.New(store, shaper.PerSecond(100), shaper.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		mustReserve(t, s, strconv.Itoa(i), 1)
	}
	clock.Advance(time.Second)
	mustReserve(t, s, "tick", 1) // the store learns the time
	deadline := time.Now().Add(10 * time.Second)
	for store.Len() > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the background sweeper left %d keys", store.Len())
		}
		time.Sleep(time.Millisecond)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil { // twice is fine
		t.Fatal(err)
	}
	if _, err := s.Reserve(bg, "after-close", 1); err != nil { // still usable
		t.Fatal(err)
	}
	// goleak (TestMain) checks that the sweeper goroutine is gone.
}

// For every algorithm, Sweep evicts exactly the keys that are idle: not one
// that is throttled or paused. Keys created after an eviction reuse the
// evicted keys' slots without inheriting their state, and a key evicted and
// used again starts cold.
func TestSweepEvictsOnlyIdleKeysForEveryAlgorithm(t *testing.T) {
	t.Parallel()
	for _, alg := range []shaper.Algorithm{shaper.LeakyBucket, shaper.GCRA, shaper.TokenBucket, shaper.FixedWindow, shaper.SlidingWindow, shaper.SlidingWindowLog} {
		t.Run(alg.String(), func(t *testing.T) {
			s, store, clock := newTest(t, shaper.PerSecond(1), shaper.WithAlgorithm(alg))
			for i := range 50 {
				mustReserve(t, s, "old"+strconv.Itoa(i), 1)
			}
			if err := s.Pause(bg, "old0", time.Hour); err != nil {
				t.Fatal(err)
			}
			clock.Advance(3 * time.Second) // every old key idle, except the paused one
			mustReserve(t, s, "fresh", 1)  // throttled for a second
			if n := store.Sweep(); n != 49 {
				t.Fatalf("swept %d keys, want the 49 idle ones", n)
			}
			if store.Len() != 3 {
				t.Fatalf("Len = %d after the sweep, want 3 (the states of fresh and old0, and old0's pause)", store.Len())
			}
			for i := range 49 { // new keys take the freed slots: each starts cold
				if ok, err := s.Allow(bg, "new"+strconv.Itoa(i), 1); !ok || err != nil {
					t.Fatalf("new key %d refused (%v, %v): it inherited an evicted state", i, ok, err)
				}
			}
			if ok, _ := s.Allow(bg, "fresh", 1); ok {
				t.Fatal("fresh admitted twice in its second: its state was lost or overwritten")
			}
			if ok, _ := s.Allow(bg, "old1", 1); !ok {
				t.Fatal("an evicted key did not start cold")
			}
			if ok, _ := s.Allow(bg, "old0", 1); ok {
				t.Fatal("the paused key was admitted: its pause was evicted")
			}
		})
	}
}
