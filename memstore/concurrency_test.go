package memstore

import (
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// Concurrent reservations at one instant (a frozen clock) on a few keys
// get every slot of each key's schedule exactly once: no two share a
// departure, none is skipped, and the leaky bucket's queue stops at
// MaxQueue. Under -race this is also the data-race test of the hot path.
func TestConcurrentReservationsGetDistinctSlots(t *testing.T) {
	t.Parallel()
	const goroutines, each = 8, 150
	keys := []string{"a", "b", "c"}
	s, store, _ := newTest(t, shaper.PerSecond(1000), shaper.WithMaxQueue(300*time.Millisecond)) // 1 ms a slot: 301 a key, of 400 asked
	var mu sync.Mutex
	delays := map[string][]time.Duration{}
	full := 0
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				key := keys[(g+i)%len(keys)]
				r, err := s.Reserve(bg, key, 1)
				mu.Lock()
				switch {
				case errors.Is(err, shaper.ErrQueueFull):
					full++
				case err != nil:
					t.Error(err)
				default:
					delays[key] = append(delays[key], r.Delay)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	admitted := 0
	for _, key := range keys {
		d := delays[key]
		slices.Sort(d)
		for i, got := range d {
			if want := time.Duration(i) * time.Millisecond; got != want {
				t.Fatalf("key %s: slot %d departs after %v, want %v (shared or skipped slot)", key, i, got, want)
			}
		}
		admitted += len(d)
	}
	if admitted+full != goroutines*each || admitted != len(keys)*301 {
		t.Fatalf("%d admitted and %d refused (ErrQueueFull) of %d: want the 301 slots of each key admitted", admitted, full, goroutines*each)
	}
	if store.Len() != len(keys) {
		t.Fatalf("Len %d, want %d", store.Len(), len(keys))
	}
}

// Concurrent requests over two dimensions (each user, and one account all
// share), on shards locked in every order, neither deadlock nor admit more
// than the account allows at one instant: exactly its burst, all or
// nothing (a refused request leaves its user's budget untouched).
func TestConcurrentMultiKeyRequestsAreAllOrNothing(t *testing.T) {
	t.Parallel()
	const users, each, burst = 16, 40, 100
	for _, combine := range []struct {
		name string
		f    func(shaper.Store, []shaper.Dimension, ...shaper.Option) (*shaper.Shaper, error)
	}{{"all", shaper.All}, {"any", shaper.Any}} {
		t.Run(combine.name, func(t *testing.T) {
			store := New(WithSweepInterval(0))
			s, err := combine.f(store, []shaper.Dimension{
				{Name: "user", Rate: shaper.Rate{Count: 1, Period: time.Hour, Burst: 1000}},
				{Name: "account", Rate: shaper.Rate{Count: 1, Period: time.Hour, Burst: burst}, Key: func(string) string { return "acct" }, Slot: true},
			}, shaper.WithClock(newFakeAt(t0)), shaper.WithAlgorithm(shaper.GCRA))
			if err != nil {
				t.Fatal(err)
			}
			perUser := make([]int, users)
			var wg sync.WaitGroup
			for u := range users {
				wg.Go(func() {
					for range each {
						ok, err := s.Allow(bg, "u"+strconv.Itoa(u), 1)
						if err != nil {
							t.Error(err)
						}
						if ok {
							perUser[u]++
						}
					}
				})
			}
			wg.Wait()
			total := 0
			for _, n := range perUser {
				total += n
			}
			want := burst
			if combine.name == "any" { // the user's own budget admits as well
				want = users * each
			}
			if total != want {
				t.Fatalf("%d admitted, want %d", total, want)
			}
			if combine.name == "all" {
				// Every user's refused requests consumed nothing of its own budget:
				// its 1,000 less what it was admitted are still there.
				for u := range users {
					st, err := s.Status(bg, "u"+strconv.Itoa(u), 1)
					if err != nil {
						t.Fatal(err)
					}
					i := slices.IndexFunc(st.Dimensions, func(d shaper.DimensionStatus) bool { return d.Name == "user" })
					if got := st.Dimensions[i].Remaining; got != int64(1000-perUser[u]) {
						t.Fatalf("user %d: %d remaining after %d admitted, want %d", u, got, perUser[u], 1000-perUser[u])
					}
				}
			}
		})
	}
}

// Shapers that share a prefix share their keys' budgets, and must agree on
// the contract; another prefix, or another store, is another budget.
func TestShapersSharingAPrefix(t *testing.T) {
	t.Parallel()
	clock := newFakeAt(t0)
	store := New(WithSweepInterval(0))
	gcra := []shaper.Option{shaper.WithClock(clock), shaper.WithAlgorithm(shaper.GCRA), shaper.WithPrefix("p:")}
	s1, err := shaper.New(store, shaper.PerSecond(1), gcra...)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := shaper.New(store, shaper.PerSecond(1), gcra...)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s1.Allow(bg, "k", 1); !ok || err != nil {
		t.Fatalf("first Allow: %v %v", ok, err)
	}
	if ok, _ := s2.Allow(bg, "k", 1); ok {
		t.Fatal("a shaper on the same prefix admitted what the other had taken")
	}
	other, err := shaper.New(store, shaper.PerSecond(1), shaper.WithClock(clock), shaper.WithAlgorithm(shaper.GCRA), shaper.WithPrefix("q:"))
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := other.Allow(bg, "k", 1); !ok {
		t.Fatal("a shaper on another prefix shares the budget")
	}
	otherStore, err := shaper.New(New(WithSweepInterval(0)), shaper.PerSecond(1), gcra...)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := otherStore.Allow(bg, "k", 1); !ok {
		t.Fatal("a shaper on another store shares the budget")
	}
	for name, opts := range map[string][]shaper.Option{
		"another rate":      {shaper.WithClock(clock), shaper.WithAlgorithm(shaper.GCRA), shaper.WithPrefix("p:")},
		"another algorithm": {shaper.WithClock(clock), shaper.WithPrefix("p:")},
	} {
		rate := shaper.PerSecond(1)
		if name == "another rate" {
			rate = shaper.PerSecond(2)
		}
		_, err := shaper.New(store, rate, opts...)
		var ce *shaper.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, shaper.ErrInvalidConfig) || ce.Field != "Prefix" {
			t.Errorf("%s on a bound prefix: %v, want a *ConfigError for Prefix", name, err)
		}
	}
}
