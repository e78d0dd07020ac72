package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
)

// TestMain serves as the fleet's worker (and victim) when the parent
// re-executes the test binary, as main does with the program.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// run measures c and fails t on any error measure reports: a 429, more
// than n calls open at the partner, a departure off the rate, a process
// that failed, a killed process's permits back too early or too late.
func run(t *testing.T, c config) Result {
	t.Helper()
	var out bytes.Buffer
	res, err := measure(&out, c)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("throughput %.1f/s (%.1f%% of %.1f/s), %d calls, %d 429s, max open %d, replay needed %v (%d of %d replayed), recovery %v, held after %d (for %v), unavailable %d",
		res.Throughput, 100*res.Throughput/res.Expected, res.Expected, res.Requests, res.Rejected, res.MaxOpen,
		res.Needed, res.Replayed, res.Departures, res.Recovery, res.HeldAfter, res.HeldFor, res.Unavailable)
	return res
}

// fleet is the scenario of the brief: 4 processes x 64 goroutines on one
// key, 10 in flight, 50/s, calls of 100 ms, for 4 s. The rate binds: 10
// permits held 100 ms each would allow 100/s.
//
// The throughput is measured from 1 s after the start (warmup): the 256
// goroutines starting at once on a 2-core host (with the race detector)
// make the first reservations slow, and the slots they miss are lost (a
// cold key grants a burst of 1). Over the whole run a fleet that then
// holds the rate exactly scores 93-97 %; from 1 s on, 100 %.
func fleet(redis, cluster string) config {
	return config{
		procs: 4, goroutines: 64, inflight: 10, rate: 50, call: 100 * time.Millisecond,
		duration: 4 * time.Second, lease: 2 * time.Second, redis: redis, cluster: cluster,
		warmup: time.Second,
	}
}

// Four processes share 10 in flight and 50/s through one Redis node: the
// partner never sees more than 10 calls open (no 429), the departures of
// all processes replay through the rate, and the fleet uses the rate.
func TestFleetHoldsInFlightAndRate(t *testing.T) {
	res := run(t, fleet(redistest.Start(t).Addr(), ""))
	if res.Throughput < 0.97*res.Expected {
		t.Errorf("throughput %.1f/s, under 97%% of the %.1f/s the rate allows", res.Throughput, res.Expected)
	}
}

// The same through a 3-master Redis Cluster (the key's rate and permits
// live in its hash slot on one master; the release notices reach every
// process through the cluster's pub/sub).
func TestFleetHoldsInFlightAndRateOnACluster(t *testing.T) {
	cluster := redistest.StartCluster(t)
	res := run(t, fleet("", strings.Join(cluster.Addrs(), ",")))
	if res.Throughput < 0.97*res.Expected {
		t.Errorf("throughput %.1f/s, under 97%% of the %.1f/s the rate allows", res.Throughput, res.Expected)
	}
}

// With a rate that never binds (1000/s), 10 permits held 400 ms each
// allow 25/s: the fleet reaches at least 85 % of it, with no 429. Each
// permit's cycle adds a release, a notice and a take to the call: about
// 4 ms on a quiet host under -race (96.9-97.6 % with calls of 200 ms), and
// up to about 26 ms when the 4 processes' 256 goroutines load the 2 cores
// of a CI host (93.8 % there, 2026-12-03). The floor is for that load: a
// hand-over that lost its notice would leave its permit idle until the
// waiter's own retry, up to a second, and the fleet under half of 25/s.
// The fake clock's TestInFlightDeliversTheConcurrencyWhenItBinds holds
// the 95 % of the hand-over itself.
func TestConcurrencyBinds(t *testing.T) {
	c := fleet(redistest.Start(t).Addr(), "")
	c.rate, c.call = 1000, 400*time.Millisecond
	res := run(t, c)
	if res.Throughput < 0.85*res.Expected {
		t.Errorf("throughput %.1f/s, under 85%% of the %.1f/s 10 permits of 400 ms allow", res.Throughput, res.Expected)
	}
}

// A victim process holds all 10 permits, each in a call, and is killed
// (SIGKILL) while the fleet waits for them: they come back when their
// leases (2 s) expire, between 4/5 of the lease and the lease after the
// kill, never before (measure checks the bounds: 1.6 s - 25 ms to 3 s),
// and the partner never sees more than 10 calls open.
func TestKilledProcessGivesPermitsBackAfterLease(t *testing.T) {
	c := fleet(redistest.Start(t).Addr(), "")
	c.kill = c.inflight
	res := run(t, c)
	if res.Recovery <= 0 {
		t.Fatalf("no recovery measured")
	}
}
