package shaper

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/throttlekit/throttlekit-go/memstore"
)

// WithHorizon: requests queued on a key take their slots in arrival
// order, never more than the span ahead of now in this process, and a
// request the queue says would wait past MaxQueue is refused at once.
func TestHorizonHoldsSlotsWithinItsSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memstore.New(memstore.WithSweepInterval(0))
		defer store.Close()
		const span = 150 * time.Millisecond
		s, err := New(store, PerSecond(10), WithAlgorithm(TrailingWindow), WithHorizon(span), WithMaxQueue(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { // the invariant, checked every millisecond
			for ctx.Err() == nil {
				s.ahead.mu.Lock()
				if a := s.ahead.keys["k"]; a != nil && time.Until(a.tail) > span {
					t.Errorf("a slot %v ahead, more than the span", time.Until(a.tail))
				}
				s.ahead.mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
		var mu sync.Mutex
		var order []int
		var full int
		var clients sync.WaitGroup
		for i := range 40 {
			clients.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond)
				_, err := s.Acquire(context.Background(), "k", 1)
				mu.Lock()
				defer mu.Unlock()
				var qf *QueueFullError
				switch {
				case errors.As(err, &qf):
					full++
				case err != nil:
					t.Errorf("client %d: %v", i, err)
				default:
					order = append(order, i)
				}
			})
		}
		clients.Wait()
		stop()
		wg.Wait()
		// 10/s for up to 3s ahead: about 30 are served, in arrival order, and
		// the rest are refused at once.
		if len(order) < 28 || len(order)+full != 40 {
			t.Fatalf("%d served, %d refused", len(order), full)
		}
		for i := 1; i < len(order); i++ {
			if order[i] < order[i-1] {
				t.Fatalf("served out of arrival order: %v", order)
			}
		}
	})
}
