package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
)

// A store holds the state of every shaper bound to it; Close stops its
// background sweeper when the program is done with it.
func ExampleNew() {
	store := memstore.New()
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(10))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	first, err := s.Reserve(ctx, "user:42", 1)
	if err != nil {
		panic(err)
	}
	second, err := s.Reserve(ctx, "user:42", 1)
	if err != nil {
		panic(err)
	}
	fmt.Println("first leaves at once:", first.Delay == 0)
	fmt.Println("second leaves", second.Time().Sub(first.Time()).Round(time.Millisecond), "after the first")
	fmt.Println("keys held:", store.Len())
	// Output:
	// first leaves at once: true
	// second leaves 100ms after the first
	// keys held: 1
}

// WithMaxKeys bounds the memory a store holds. At the cap a new key takes
// the place of an idle one; while every key is still throttled, a new key
// is refused with ErrFull and nothing is written.
func ExampleWithMaxKeys() {
	store := memstore.New(memstore.WithMaxKeys(2))
	defer store.Close()
	s, err := shaper.New(store, shaper.PerMinute(1))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c"} {
		_, err := s.Reserve(ctx, key, 1)
		switch {
		case errors.Is(err, memstore.ErrFull):
			fmt.Println(key, "refused: the store is full")
		case err != nil:
			panic(err)
		default:
			fmt.Println(key, "admitted")
		}
	}
	fmt.Println("keys held:", store.Len())
	// Output:
	// a admitted
	// b admitted
	// c refused: the store is full
	// keys held: 2
}

// Sweep evicts at once the keys whose state is equivalent to a cold key's,
// as of the latest instant the store has seen; the background sweeper does
// the same every WithSweepInterval.
func ExampleStore_Sweep() {
	store := memstore.New(memstore.WithSweepInterval(time.Hour))
	defer store.Close()
	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := shaper.New(store, shaper.Every(time.Millisecond), shaper.WithClock(clock))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if _, err := s.Reserve(ctx, "a", 1); err != nil {
		panic(err)
	}
	clock.Advance(5 * time.Millisecond) // "a" goes idle; the store sees that instant with "b"
	if _, err := s.Reserve(ctx, "b", 1); err != nil {
		panic(err)
	}
	fmt.Println("held:", store.Len())
	fmt.Println("evicted:", store.Sweep())
	fmt.Println("held:", store.Len())
	// Output:
	// held: 2
	// evicted: 1
	// held: 1
}
