package storetest

import (
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/timer"
)

// MaxCost, found through Status, is algorithms.MaxCost of the transition
// the shaper runs: for every scenario of one contract, built here from the
// algorithms package directly.
func TestMaxCostIsTheAlgorithms(t *testing.T) {
	t.Parallel()
	build := map[string]func() (algorithms.Algorithm, error){
		"leaky 7/3s": func() (algorithms.Algorithm, error) {
			return algorithms.NewLeakyBucket(algorithms.Rate{Count: 7, Period: 3 * time.Second, Burst: 1}, 5*time.Second)
		},
		"leaky 10/s burst 3": func() (algorithms.Algorithm, error) {
			return algorithms.NewLeakyBucket(algorithms.Rate{Count: 10, Period: time.Second, Burst: 3}, 2*time.Second)
		},
		"gcra": func() (algorithms.Algorithm, error) {
			return algorithms.NewGCRA(algorithms.Rate{Count: 5, Period: time.Second, Burst: 5})
		},
		"token": func() (algorithms.Algorithm, error) {
			return algorithms.NewTokenBucket(algorithms.Rate{Count: 4, Period: time.Second, Burst: 6})
		},
		"fixed":   func() (algorithms.Algorithm, error) { return algorithms.NewFixedWindow(6, time.Second) },
		"sliding": func() (algorithms.Algorithm, error) { return algorithms.NewSlidingWindow(9, 2*time.Second, 10) },
		"log":     func() (algorithms.Algorithm, error) { return algorithms.NewSlidingLog(5, time.Second) },
		"quota":   func() (algorithms.Algorithm, error) { return algorithms.NewQuota(30, algorithms.Daily(14*time.Hour)) },
	}
	for _, sc := range Scenarios() {
		if sc.Dims != nil {
			continue
		}
		b, ok := build[sc.Name]
		if !ok {
			t.Fatalf("no algorithm for scenario %q", sc.Name)
		}
		alg, err := b()
		if err != nil {
			t.Fatal(err)
		}
		s := sc.must(t, memory(), timer.NewFake(T0), "max:")
		if got, want := MaxCost(t, s), algorithms.MaxCost(alg); got != want {
			t.Fatalf("%s: MaxCost %d, algorithms.MaxCost %d", sc.Name, got, want)
		}
	}
}

// The memory store agrees with itself: the suites' runs are deterministic,
// so that a difference between two stores is theirs.
func TestTheMemoryStoreMatchesItself(t *testing.T) {
	t.Parallel()
	Conformance(t, Candidate{Name: "memory", New: memory})
	Edges(t, Candidate{Name: "memory", New: memory})
}

// The in-flight scenario runs on the memory store against itself, so that
// its transcript is deterministic (InFlight compares two runs).
func TestTheInFlightScenarioIsDeterministic(t *testing.T) {
	InFlight(t, Candidate{Name: "memory", New: memory})
}
