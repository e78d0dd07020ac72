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
// contract and never exceed it in any second.
func TestFleetSharesOneBudget(t *testing.T) {
	srv := redistest.Start(t)
	var out bytes.Buffer
	res, err := measure(&out, config{procs: 2, rate: 100, duration: 2 * time.Second, redis: srv.Addr()})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if res.ErrorPct < -3 || res.ErrorPct > 3 {
		t.Errorf("aggregate %.1f/s is %.1f%% off the contract of 100/s", res.Rate, res.ErrorPct)
	}
	for i, n := range res.PerWorker {
		if n < 20 {
			t.Errorf("process %d sent only %d requests: the budget was not shared", i+1, n)
		}
	}
}
