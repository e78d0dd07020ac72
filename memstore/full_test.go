package memstore

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/gcra"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// An invalid option is reported when a shaper is bound to the store, by
// New, All and Any alike, as a *shaper.ConfigError naming the option; such a
// store starts no sweeper (goleak, TestMain, would see it: none is closed).
func TestInvalidOptionsAreConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		field string
		opt   Option
	}{
		{"MaxKeys", WithMaxKeys(-1)},
		{"SweepInterval", WithSweepInterval(-1)},
		{"SweepInterval", WithSweepInterval(-time.Hour)},
	} {
		for name, bind := range map[string]func(st *Store) error{
			"New": func(st *Store) error { _, err := shaper.New(st, shaper.PerSecond(1)); return err },
			"All": func(st *Store) error {
				_, err := shaper.All(st, []shaper.Dimension{{Name: "a", Rate: shaper.PerSecond(1)}, {Name: "b", Rate: shaper.PerMinute(10)}})
				return err
			},
			"Any": func(st *Store) error {
				_, err := shaper.Any(st, []shaper.Dimension{{Name: "a", Rate: shaper.PerSecond(1)}, {Name: "b", Rate: shaper.PerMinute(10)}})
				return err
			},
		} {
			st := New(c.opt) // not closed: an invalid store has no sweeper to stop
			err := bind(st)
			var ce *shaper.ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, shaper.ErrInvalidConfig) || ce.Field != c.field {
				t.Errorf("%s on a store WithMaxKeys/WithSweepInterval(-1): %v (%T), want a *shaper.ConfigError for %s matching ErrInvalidConfig", name, err, err, c.field)
			}
		}
	}
	// The valid bounds: 0 is no cap, and no sweeper.
	st := New(WithMaxKeys(0), WithSweepInterval(0))
	if _, err := shaper.New(st, shaper.PerSecond(1)); err != nil {
		t.Fatalf("WithMaxKeys(0), WithSweepInterval(0): %v", err)
	}
}

// snapshot is every entry a store holds, by shard and namespace: what a
// refused call must leave as it found it.
type snapshot struct {
	Len     int64
	Entries map[string]spaceSnap
	Cap     []capEntry
}

type spaceSnap struct {
	TATs    map[string]float64
	Gens    map[string]uint32
	Ledgers map[string]gcra.Ledger
	States  map[string][]float64
	Paused  map[string]float64
	Clamps  map[string]clampState
}

func (m *mem) snapshot() snapshot {
	s := snapshot{Len: m.keys.Load(), Entries: map[string]spaceSnap{}}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for ns, sp := range sh.spaces {
			if sp == nil {
				continue
			}
			e := spaceSnap{TATs: map[string]float64{}, Gens: map[string]uint32{}, Ledgers: map[string]gcra.Ledger{}, States: map[string][]float64{},
				Paused: maps.Clone(sp.paused), Clamps: maps.Clone(sp.clamps)}
			for k, j := range sp.tats.index {
				e.TATs[k], e.Gens[k] = sp.tats.slab[j], sp.tats.gens[j]
				if l := sp.tats.ledger(j); l != nil {
					e.Ledgers[k] = *l
				}
			}
			for k, st := range sp.states.states {
				e.States[k] = slices.Clone(st)
			}
			if len(e.TATs)+len(e.States)+len(e.Paused)+len(e.Clamps) > 0 { // a namespace created empty holds nothing
				s.Entries[fmt.Sprintf("shard %d ns %d", i, ns)] = e
			}
		}
		sh.mu.Unlock()
	}
	m.capMu.Lock()
	s.Cap = slices.Clone(m.capH)
	m.capMu.Unlock()
	return s
}

// A store at its cap whose every entry is busy refuses a new entry with an
// error matching ErrFull, on every path that makes one, and writes
// nothing: no entry, no count, no record in the idle index, and no change
// to the other keys of the same request.
func TestFullStoreRefusesAndWritesNothing(t *testing.T) {
	t.Parallel()
	const maxKeys = 6
	slow := shaper.Rate{Count: 1, Period: time.Minute, Burst: 100} // every key stays busy for minutes
	type setup struct {
		s     *shaper.Shaper
		store *Store
	}
	fill := func(t *testing.T, s *shaper.Shaper, store *Store) {
		t.Helper()
		for i := 0; store.Len() < maxKeys; i++ {
			mustReserve(t, s, "k"+strconv.Itoa(i), 1)
		}
	}
	single := func(alg shaper.Algorithm) func(t *testing.T) setup {
		return func(t *testing.T) setup {
			store := New(WithMaxKeys(maxKeys), WithSweepInterval(0))
			s, err := shaper.New(store, slow, shaper.WithClock(newFakeAt(t0)), shaper.WithAlgorithm(alg))
			if err != nil {
				t.Fatal(err)
			}
			fill(t, s, store)
			return setup{s, store}
		}
	}
	// Two dimensions: the caller's key, and one account every key shares.
	multi := func(combine func(shaper.Store, []shaper.Dimension, ...shaper.Option) (*shaper.Shaper, error)) func(t *testing.T) setup {
		return func(t *testing.T) setup {
			store := New(WithMaxKeys(maxKeys), WithSweepInterval(0))
			s, err := combine(store, []shaper.Dimension{
				{Name: "user", Rate: slow},
				{Name: "account", Rate: slow, Key: func(string) string { return "acct" }, Slot: true},
			}, shaper.WithClock(newFakeAt(t0)))
			if err != nil {
				t.Fatal(err)
			}
			fill(t, s, store)
			return setup{s, store}
		}
	}
	calls := []struct {
		name string
		call func(setup) error
	}{
		{"Reserve", func(u setup) error { _, err := u.s.Reserve(bg, "new", 1); return err }},
		{"Allow", func(u setup) error {
			ok, err := u.s.Allow(bg, "new", 1)
			if ok {
				return errors.New("admitted")
			}
			return err
		}},
		{"Pause", func(u setup) error { return u.s.Pause(bg, "new", time.Hour) }},
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) setup
	}{
		{"leaky-bucket", single(shaper.LeakyBucket)},
		{"gcra", single(shaper.GCRA)},
		{"token-bucket", single(shaper.TokenBucket)},
		{"sliding-window-log", single(shaper.SlidingWindowLog)},
		{"all", multi(shaper.All)},
		{"any", multi(shaper.Any)},
	} {
		for _, call := range calls {
			t.Run(c.name+"/"+call.name, func(t *testing.T) {
				u := c.setup(t)
				before := u.store.m.snapshot()
				if before.Len != maxKeys {
					t.Fatalf("filled to Len %d, want %d", before.Len, maxKeys)
				}
				err := call.call(u)
				if !errors.Is(err, ErrFull) {
					t.Fatalf("a new key at the cap with every key busy: %v, want ErrFull", err)
				}
				if after := u.store.m.snapshot(); !reflect.DeepEqual(before, after) {
					t.Fatalf("the refused call wrote:\nbefore %+v\nafter  %+v", before, after)
				}
			})
		}
	}

	// A settle that charges an extra to a key found cold (evicted: here
	// reset, idle past its slot and swept) makes an entry too: at the cap
	// it is refused, and writes nothing.
	for _, alg := range []shaper.Algorithm{shaper.LeakyBucket, shaper.TokenBucket} {
		t.Run(alg.String()+"/Settle", func(t *testing.T) {
			store := New(WithMaxKeys(maxKeys), WithSweepInterval(0))
			clock := newFakeAt(t0)
			s, err := shaper.New(store, slow, shaper.WithClock(clock), shaper.WithAlgorithm(alg))
			if err != nil {
				t.Fatal(err)
			}
			r := mustReserve(t, s, "gone", 1)
			if err := s.Reset(bg, "gone"); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Hour)
			mustReserve(t, s, "k0", 1) // the store's now moves on: the sweep finds "gone" idle
			store.Sweep()
			fill(t, s, store)
			before := store.m.snapshot()
			for _, e := range before.Entries {
				if _, ok := e.TATs["gone"]; ok {
					t.Fatal("the reset key, idle past its slot, was not swept")
				}
			}
			if err := r.Settle(bg, 3); !errors.Is(err, ErrFull) {
				t.Fatalf("settling an extra on an evicted key at the cap: %v, want ErrFull", err)
			}
			// The stale heap entries of keys gone may be dropped: the entries
			// are what a refused settle must leave as they were.
			if after := store.m.snapshot(); after.Len != before.Len || !reflect.DeepEqual(before.Entries, after.Entries) {
				t.Fatalf("the refused settle wrote:\nbefore %+v\nafter  %+v", before, after)
			}
		})
	}
}
