package main

import (
	"io"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestReportCountsTheBusiestSecond(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var deps []time.Time
	for i := range 100 { // exactly 20 ms apart: 50 in any half-open second
		deps = append(deps, start.Add(time.Duration(i)*20*time.Millisecond))
	}
	deps[50] = deps[50].Add(-time.Microsecond) // one early by a hair: 51 fit in [t0, t0+1s)
	late := make([]time.Duration, len(deps))
	r := report(deps, late)
	if r.maxIn1s != 51 {
		t.Fatalf("max in 1 s = %d, want 51", r.maxIn1s)
	}
	if r.rate < 50 || r.rate > 50.01 || r.gapP50 != 20*time.Millisecond {
		t.Fatalf("rate %v gap p50 %v, want 50/s and 20ms", r.rate, r.gapP50)
	}
}

func TestRunStaysWithinTheContract(t *testing.T) {
	if err := run(io.Discard, "200/s", 30, 3); err != nil { // 30 calls at 200/s: about 0.3 s per mode
		t.Fatal(err)
	}
	if err := run(io.Discard, "200/s", 1, 1); err == nil {
		t.Fatal("n = 1 accepted")
	}
	if err := run(io.Discard, "200/fortnight", 30, 1); err == nil {
		t.Fatal("a bad rate accepted")
	}
}
