package shaper

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// Algorithms without a reservation recurrence serve Wait by sleeping until
// their retry-after (plus jitter) and trying again: one timer per refusal,
// never a spin.
func TestWaitRetryOnWindowAlgorithms(t *testing.T) {
	t.Parallel()
	// 2 per second, burst 2: two at once, then the third when capacity returns.
	reopen := map[string]time.Duration{
		"gcra": 500 * time.Millisecond, "token-bucket": 500 * time.Millisecond,
		"fixed-window": time.Second, "sliding-log": time.Second,
		"sliding-window(10)": 1050 * time.Millisecond, // the t0 bucket must weigh half
	}
	for _, alg := range []Algorithm{GCRA, TokenBucket, FixedWindow, SlidingWindow, SlidingWindowLog} {
		s, _, clock := newTest(t, PerSecond(2).WithBurst(2), WithAlgorithm(alg), WithMaxQueue(10*time.Second))
		for range 2 {
			if err := s.Wait(bg, "k", 1); err != nil {
				t.Fatalf("%v: %v", alg, err)
			}
		}
		done := waitAsync(bg, s, "k", 1)
		armed(t, clock, 1)
		clock.Advance(reopen[alg.String()] - 10*time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("%v: Wait returned %v before capacity returned", alg, err)
		case <-time.After(20 * time.Millisecond):
		}
		// The retry lands at most an eighth of the wait (<= 50 ms) after capacity returns.
		for i := 0; ; i++ {
			clock.Advance(10 * time.Millisecond)
			finished, err := doneOrArmed(t, clock, done)
			if finished {
				if err != nil {
					t.Fatalf("%v: %v", alg, err)
				}
				break
			}
			if i > 12 {
				t.Fatalf("%v: still waiting 120 ms after capacity returned", alg)
			}
		}
	}
}

// doneOrArmed waits until the sleeper has either returned (finished) or armed
// its next timer, without guessing how long the goroutine takes to run.
func doneOrArmed(t *testing.T, clock *timer.Fake, done <-chan error) (finished bool, err error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			return true, err
		default:
		}
		if clock.Pending() > 0 {
			return false, nil
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatal("the sleeper neither returned nor armed a timer")
	return false, nil
}

func TestWaitRetryGivesUpAtMaxQueueAndDeadline(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerMinute(1), WithAlgorithm(FixedWindow), WithMaxQueue(10*time.Second))
	if err := s.Wait(bg, "k", 1); err != nil {
		t.Fatal(err)
	}
	err := s.Wait(bg, "k", 1)
	var qf *QueueFullError
	if !errors.As(err, &qf) || qf.Delay != time.Minute || qf.MaxQueue != 10*time.Second {
		t.Fatalf("Wait = %v, want a QueueFullError for the 1 min until the next window", err)
	}
	long, _, _ := newTest(t, PerMinute(1), WithAlgorithm(FixedWindow), WithMaxQueue(time.Hour))
	_ = long.Wait(bg, "k", 1)
	ctx, cancel := context.WithTimeout(bg, time.Second)
	defer cancel()
	if err := long.Wait(ctx, "k", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past the deadline = %v", err)
	}
	// Reserve on a window algorithm never queues: its QueueFullError says so.
	_, err = long.Reserve(bg, "k", 1)
	if !errors.As(err, &qf) || qf.MaxQueue != 0 || qf.Delay != time.Minute {
		t.Fatalf("Reserve = %v", err)
	}
}

func TestWaitRetryCancelled(t *testing.T) {
	t.Parallel()
	s, _, clock := newTest(t, PerMinute(1), WithAlgorithm(SlidingWindowLog), WithMaxQueue(time.Hour))
	_ = s.Wait(bg, "k", 1)
	ctx, cancel := context.WithCancel(bg)
	done := waitAsync(ctx, s, "k", 1)
	armed(t, clock, 1)
	cancel()
	if err := result(t, done); err != context.Canceled {
		t.Fatalf("Wait = %v", err)
	}
}

func TestJitterBounds(t *testing.T) {
	t.Parallel()
	for _, w := range []time.Duration{0, time.Millisecond, time.Second, time.Hour} {
		for range 1000 {
			j := jitter(w)
			if j < time.Microsecond || j > time.Microsecond+min(w/8, 50*time.Millisecond) {
				t.Fatalf("jitter(%v) = %v", w, j)
			}
		}
	}
}
