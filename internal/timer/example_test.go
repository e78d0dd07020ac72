package timer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// A sleep to a deadline two hours away on the fake clock, with a suspend in the
// middle: the wall clock jumps 90 minutes while no timer runs, and the sleeper
// notices at the end of its current one-minute chunk.
func ExampleSleepUntil() {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := timer.NewFake(start)
	done := make(chan error)
	go func() { done <- timer.SleepUntil(context.Background(), clock, start.Add(2*time.Hour)) }()

	ctx := context.Background()
	for range 30 { // 30 minutes pass normally, a chunk at a time
		_ = clock.WaitForTimers(ctx, 1)
		clock.Advance(time.Minute)
	}
	_ = clock.WaitForTimers(ctx, 1)
	clock.Jump(90 * time.Minute) // the host was suspended
	clock.Advance(time.Minute)   // the current chunk ends
	fmt.Println(<-done, clock.Now().Sub(start))
	// Output: <nil> 2h1m0s
}
