package main

import (
	"bytes"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
)

// TestMain serves as the fleet's worker when the parent re-executes the test
// binary, as main does with the program.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// Two processes share 100/s through a real Redis: together they reach the
// contract and never exceed it in any second. Over is held to 3 %; under,
// to 8 %: a request that wakes past its slot's lateness takes a new slot
// and its old one is lost, and on a loaded 2-core CI host departures were
// seen 99 ms late (-3.9 % there, 2026-12-03; within 1 % on a quiet one).
func TestFleetSharesOneBudget(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	res, err := measure(&out, config{procs: 2, rate: 100, duration: 2 * time.Second, redis: srv.Addr()})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if res.ErrorPct < -8 || res.ErrorPct > 3 {
		t.Errorf("aggregate %.1f/s is %.1f%% off the contract of 100/s", res.Rate, res.ErrorPct)
	}
	for i, n := range res.PerWorker {
		if n < 20 {
			t.Errorf("process %d sent only %d requests: the budget was not shared", i+1, n)
		}
	}
}

// A contract changed live from one process reaches every process of the
// fleet: from the refresh interval (plus the slots already held) after the
// change, the busiest second of departures holds the new contract, and the
// fleet still uses it.
func TestFleetFollowsALiveChange(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	res, err := measure(&out, config{procs: 2, rate: 300, duration: 4 * time.Second, redis: srv.Addr(), change: 100, changeAt: 1500 * time.Millisecond})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if res.MostBefore < 270 {
		t.Errorf("before the change the fleet sent at most %d in a second, under the 300/s it had", res.MostBefore)
	}
	if res.RateAfter < 95 || res.RateAfter > 103 {
		t.Errorf("after the change the fleet ran at %.1f/s, want the new 100/s", res.RateAfter)
	}
}

// A contract raised live from one process while three processes run
// (issue 26): while the others have not followed yet, each reads the shared
// schedule in its own contract, and the fleet's busiest second over the
// whole run stays within the more generous contract (measure checks it);
// once they follow it runs at the new rate (at least 180/s of 250/s: the
// host's lateness costs slots as above; 191/s on a loaded CI host).
func TestFleetStaysWithinTheMoreGenerousContractAcrossAChange(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	res, err := measure(&out, config{procs: 3, rate: 100, duration: 4 * time.Second, redis: srv.Addr(), change: 250, changeAt: 1500 * time.Millisecond})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if res.MostAcross == 0 || res.RateAfter < 180 {
		t.Errorf("after the change the fleet ran at %.1f/s, want near the new 250/s", res.RateAfter)
	}
}

// A partner's low count of calls left, read by one process, reaches every
// process through Redis: until the partner's reset the whole fleet (which
// would send 300/s) sends no more than it has left, spread over the reset,
// and still uses them.
func TestFleetSpreadsWhatAPartnerHasLeft(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	res, err := measure(&out, config{procs: 2, rate: 300, duration: 4 * time.Second, redis: srv.Addr(), clamp: 10, clampReset: 2 * time.Second, clampAt: time.Second})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	// 10 slots 200 ms apart from the clamp: the first within clampLead.
	if res.Clamped < 8 {
		t.Errorf("the fleet sent %d of the 10 calls the partner had left", res.Clamped)
	}
}
