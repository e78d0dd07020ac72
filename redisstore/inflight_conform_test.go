package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/internal/storetest"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// The in-flight scenario gives the memory store's transcript on a node and
// on a real 3-master cluster: permits up to the limit, released once,
// given back by a cancel and a refusal, counted by Status, and waiters
// served in order, woken by the release notices of the store's
// subscription. And fair turns give the memory store's replies, bit for
// bit: lua/fair_turn.lua is internal/fair's Turn; an owner alone is
// granted every turn it asks for. And a learning fleet
// paces and reports as it does on memory: lua/learn.lua is memstore's
// Learn.
func TestInFlightAndTurnsMatchMemoryStore(t *testing.T) {
	t.Parallel()
	_, node := redisClient(t)
	cluster := redistest.StartCluster(t).Client(t)
	for _, client := range []redis.UniversalClient{node, cluster} {
		c := storetest.Candidate{Name: fmt.Sprintf("%T", client), New: func() shaper.Store {
			s := New(client, WithClientClock(), WithTimeout(slowMachine))
			t.Cleanup(func() { _ = s.Close() })
			return s
		}}
		storetest.InFlight(t, c)
		storetest.FairTurns(t, c)
		storetest.FairLoneOwner(t, c)
		storetest.FairDeadOwner(t, c)
		storetest.Learned(t, c)
	}
}

// A ctx that ends while the take's script runs leaves no permit behind:
// the lease the script may have taken is given back at once, not when it
// expires (found by the in-flight fleet example: 500 Acquires with
// timeouts of 0 to 600 µs left every permit of 100 held for a lease).
func TestInFlightATakeCutShortLeavesNoPermit(t *testing.T) {
	t.Parallel()
	srv, deadlines := redisClient(t)
	plain := srv.Client() // its calls run on after the caller's ctx ends
	for _, client := range []redis.UniversalClient{plain, deadlines} {
		st := New(client, WithTimeout(slowMachine))
		defer st.Close()
		s, err := shaper.All(st, []shaper.Dimension{{Name: "open", InFlight: 100}}, shaper.WithName(fmt.Sprintf("cut-short-%p", client)))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var wg sync.WaitGroup
		for i := range 500 {
			wg.Go(func() {
				c, cancel := context.WithTimeout(ctx, time.Duration(i%13)*50*time.Microsecond)
				defer cancel()
				if r, err := s.Acquire(c, "k", 1); err == nil {
					_ = r.Release(ctx)
				}
			})
		}
		wg.Wait()
		status, err := s.Status(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if held := status.Dimensions[0].InFlight; held != 0 {
			t.Fatalf("%T: %d permits held after every Acquire returned and every grant was released", client, held)
		}
	}
}
