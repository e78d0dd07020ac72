//go:build faults

package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
)

// Under load each process sends many reservations per Redis call
// (coalescing), and the fleet still holds the contract: two processes of
// 64 goroutines at 2,000/s run fewer scripts than they send requests, and
// never exceed the contract in any second, departures' lateness aside. It loads both cores for 2 s, so it runs with the fault tests
// (make test-faults), not beside the wall-clock tests of make test. That lateness is the host's: 128 goroutines under -race on two
// loaded cores wake up to about 25 ms late (the same run one call per
// reservation measured 2,029 to 2,045 in its busiest second), so the test
// allows 30 ms of spread, 60 departures, where measure allows 10 ms.
func TestFleetCoalescesAndHoldsTheContract(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	res, err := measure(&out, config{procs: 2, rate: 2000, goroutines: 64, duration: 2 * time.Second, redis: srv.Addr(), spread: 30 * time.Millisecond})
	if err != nil { // measure fails when a second holds more than the contract allows
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	// The contract is the safety property: measure fails on any second
	// that holds more than it allows, and the aggregate may not pass it.
	// How close the fleet comes to it is speed, which make bench measures
	// (BenchmarkRedis): 128 goroutines under -race on two cores are CPU
	// bound, and reach 93 to 99 % of 2,000/s depending on the host's load
	// (the same at 5b16601, before the stores moved out of package shaper).
	// Below half, coalescing would be starving its callers.
	if res.ErrorPct > 3 {
		t.Errorf("aggregate %.1f/s is %.1f%% over the contract of 2000/s", res.Rate, res.ErrorPct)
	}
	if res.ErrorPct < -50 {
		t.Errorf("aggregate %.1f/s is %.1f%% under the contract of 2000/s: the fleet is starved", res.Rate, res.ErrorPct)
	}
	// Without coalescing the fleet runs a script per request sent, one per
	// goroutine whose last reservation fell past the run's end (refused,
	// never sent), and a contract read a second per process: fewer means
	// some reservations shared a call. (How many share depends on how much
	// the calls overlap: 1.27 requests a script on a loaded host, about
	// 1.0 on an idle one at this rate, where 8 calls may be in flight per
	// lane before any waits for a batch.)
	const procs, goroutines = 2, 64
	if alone := int64(res.Arrivals) + procs*goroutines; res.ScriptCalls == 0 || res.ScriptCalls >= alone {
		t.Errorf("%d scripts for %d requests and %d refused at the end: the processes did not coalesce", res.ScriptCalls, res.Arrivals, procs*goroutines)
	}
}
