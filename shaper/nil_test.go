package shaper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// Wrong arguments give typed errors, never panics, and write nothing: a
// typed nil store behind the Store interface (New(nil) always gave a
// ConfigError; New((*memstore.Store)(nil)) panicked), a Route whose pick
// returns a nil *Shaper (a missed map lookup), methods of a nil *Shaper, and
// Reset with a done ctx (it used to erase the key).
func TestWrongArgumentsAreTypedErrorsAndWriteNothing(t *testing.T) {
	t.Parallel()
	for _, store := range []Store{nil, (*memstore.Store)(nil), (*redisstore.Store)(nil)} {
		if _, err := New(store, PerSecond(1)); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("New(%#v): %v, want a *ConfigError", store, err)
		}
		if _, err := All(store, []Dimension{{Name: "a", Rate: PerSecond(1)}}); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("All(%#v): %v, want a *ConfigError", store, err)
		}
	}

	shapers := map[string]*Shaper{} // a lookup that misses returns a nil *Shaper
	r := Route(func(key string) Reserver { return shapers[key] })
	if _, err := r.Reserve(bg, "nobody", 1); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("Route to a nil *Shaper: Reserve gave %v, want a *KeyError", err)
	}
	if err := r.Wait(bg, "nobody", 1); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("Route to a nil *Shaper: Wait gave %v", err)
	}
	if err := r.Pause(bg, "nobody", time.Second); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("Route to a nil *Shaper: Pause gave %v", err)
	}

	var nilShaper *Shaper
	var rs Reserver = nilShaper
	if _, err := rs.Reserve(bg, "k", 1); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil *Shaper Reserve: %v", err)
	}
	if err := rs.Wait(bg, "k", 1); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil *Shaper Wait: %v", err)
	}
	if err := rs.Pause(bg, "k", time.Second); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil *Shaper Pause: %v", err)
	}
	if ok, err := nilShaper.Allow(bg, "k", 1); ok || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil *Shaper Allow: %v %v", ok, err)
	}
	if err := nilShaper.Reset(bg, "k"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil *Shaper Reset: %v", err)
	}
	if nilShaper.Name() != "" || nilShaper.MaxQueue() != 0 {
		t.Fatal("nil *Shaper Name or MaxQueue")
	}

	s, store, _ := newTest(t, PerSecond(1))
	mustReserve(t, s, "k", 1)
	done, cancel := context.WithCancel(bg)
	cancel()
	if err := s.Reset(done, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reset with a done ctx: %v, want context.Canceled", err)
	}
	if store.Len() != 1 {
		t.Fatal("Reset with a done ctx erased the key")
	}
	if r, err := s.Reserve(bg, "k", 1); err != nil || r.Delay == 0 {
		t.Fatalf("after a refused Reset the key is not as it was: %v %v", r.Delay, err)
	}
}
