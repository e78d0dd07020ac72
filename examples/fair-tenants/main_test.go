package main

import (
	"bytes"
	"math"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
)

// TestMain serves as a process of the fleet when the parent re-executes
// the test binary, as main does with the program.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// The in-memory run, 4 s at 20/s: backfill (Batch) alone for the first
// second, then acme (weight 3) and globex (weight 1) backlogged, and a
// support job (Interactive) at 2, 2.5, 3 and 3.5 s.
//
// Tolerances: acme:globex is decided by the turns (start-time fair
// queuing), not by timing, so over the 3 s both are backlogged (about 50
// Normal departures) it is off 3:1 by a departure at most: 10 % allows
// that (37:13 is 2.85, 38:12 3.17). A support job departs at the first
// slot not yet granted when it arrives (the process holds one slot ahead
// of the turns), or the one after when the turn owed to the lower classes
// (one after 9 in a row over them) is due then: at most 3 slots later. Its
// Run may lag that slot by the queue's timer and the scheduler, a few ms
// under -race (schedLag).
func TestTenantsShareTheKey(t *testing.T) {
	c := config{rate: 20, workers: 4, duration: 4 * time.Second}
	var out bytes.Buffer
	res, err := local(&out, c)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.InteractiveWaits) != 4 {
		t.Errorf("%d support jobs departed, want 4", len(res.InteractiveWaits))
	}
	limit := ms(3*slot(c.rate) + schedLag)
	for _, w := range res.InteractiveWaits {
		if w > limit {
			t.Errorf("a support job waited %.1f ms, more than 3 slots (%v) and %v", w, 3*slot(c.rate), schedLag)
		}
	}
	if r := res.AcmeToGlobex; math.Abs(r/3-1) > 0.10 {
		t.Errorf("acme:globex %.2f:1 (%d:%d), want 3:1 within 10 %%", r, res.Departures[acme.Name], res.Departures[globex.Name])
	}
	if res.Busiest > c.rate+burst {
		t.Errorf("%d departures in one second, more than the rate and its burst (%d)", res.Busiest, c.rate+burst)
	}
	// backfill's 1 turn in 10: 6 of the 60 from 1 s, one less if the
	// Normal backlogs' first turn comes a slot late (they are queued as
	// the slot of 1 s is being granted); 4 leaves a margin.
	if n := res.Departures[backfill.Name]; n < 4 {
		t.Errorf("backfill (Batch) got %d turns of 60 while the Normal flows were backlogged, want about 1 in 10", n)
	}
}

// schedLag is how late a job's Run may be called after its slot: the
// queue's timer and the goroutines' scheduling on a loaded 2-core host
// under -race.
const schedLag = 20 * time.Millisecond

// Two OS processes share 50/s on one key through a real redis-server:
// acme (weight 3) in one, globex (weight 1) in the other, each backlogged
// through its own queue for 6 s.
//
// Tolerances: the shares are decided in Redis, turn by turn (start-time
// fair queuing over both processes' flows), not by timing, so they hold
// on a loaded machine: over the 5 s after the first second (about 250
// departures) acme's share is off 0.75 by a few departures at most, and
// 5 % (relative) allows that. The busiest 1 s window is counted on the
// departure instants (Run being called): the slots, granted in Redis,
// conform to 50/s burst 1 (at most 51 in a 1 s window, the figure the
// program prints and judges); a Run lags its slot by the queue's timer
// and the scheduler, and on a loaded 2-core host two Runs 50 slots apart
// can lag by more than a slot (20 ms) apart, which brings one more into a
// window (52 seen with both cores busy; 53 once in a fresh-clone make test
// under -race, two Runs lagging 40 ms apart). The test allows two such
// departures and no more: a Run is not told its slot (package queue does
// not pass it), so the lag cannot be measured per departure as
// examples/redis-fleet does; the slots themselves are held to rate + burst
// by TestFairSharesAcrossTwoStores (redisstore). The throughput after the first second: a
// turn passing between the processes costs no slot (the dispatcher asks
// a slot ahead while another process's flow has turns), so 90 % leaves
// room for a slow Redis call on a loaded host, no more.
func TestFleetSharesAcrossProcesses(t *testing.T) {
	c := config{procs: 2, rate: 50, workers: 4, duration: 6 * time.Second, redis: redistest.Start(t).Addr()}
	var out bytes.Buffer
	res, err := fleet(&out, c)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("acme's share %.3f, busiest 1 s %d, throughput %.1f/s, unavailable %d", res.AcmeShare, res.Busiest, res.Throughput, res.Unavailable)
	if math.Abs(res.AcmeShare-0.75) > 0.05*0.75 {
		t.Errorf("acme's share %.3f after the first second, want 0.75 within 5 %%", res.AcmeShare)
	}
	if res.Busiest > c.rate+burst+2 {
		t.Errorf("%d departures in one second, more than the rate and its burst (%d) and two Runs' lag", res.Busiest, c.rate+burst)
	}
	if res.Throughput < 0.9*float64(c.rate) {
		t.Errorf("%.1f departures/s after the first second, under 90 %% of %d/s", res.Throughput, c.rate)
	}
}
