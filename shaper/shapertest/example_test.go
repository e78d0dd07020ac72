package shapertest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/shaper/shapertest"
)

// A test of pacing that never sleeps: a waiter leaves exactly when the clock
// reaches its slot.
func ExampleClock() {
	ctx := context.Background()
	clock := shapertest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memstore.New()
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(2), shaper.WithClock(clock))
	if err != nil {
		panic(err)
	}
	_ = s.Wait(ctx, "k", 1) // the first unit leaves at once

	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx, "k", 1) }() // the second waits 500 ms
	_ = clock.WaitForTimers(ctx, 1)
	clock.Advance(499 * time.Millisecond)
	select {
	case <-done:
		fmt.Println("left early")
	default:
		fmt.Println("still waiting at 499ms")
	}
	clock.Advance(time.Millisecond)
	fmt.Println("left at 500ms:", <-done)
	// Output:
	// still waiting at 499ms
	// left at 500ms: <nil>
}
