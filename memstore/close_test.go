package memstore

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
	"go.uber.org/goleak"
)

// sweepers returns how many sweeper goroutines there are: running, or
// started and not yet run (those show only as New's gowrap).
func sweepers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "memstore.(*mem).sweeper(") + strings.Count(string(buf), "memstore.New.gowrap")
}

// awaitSweepers waits until n sweepers run (a goroutine just started may not
// have run yet, and one whose Close returned has closed its done channel
// but may not have returned yet) and returns how many run then.
func awaitSweepers(n int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := sweepers()
		if got == n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// Only a valid store with a sweep interval runs a sweeper, and Close stops
// it and waits for it: no goroutine outlives Close. (Not parallel: it counts
// every sweeper in the process.)
func TestCloseStopsTheSweeper(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	if n := awaitSweepers(0); n != 0 { // every other test's store is closed, or has none
		t.Fatalf("%d sweepers run before the test", n)
	}
	for _, opts := range [][]Option{{WithSweepInterval(0)}, {WithMaxKeys(-1)}, {WithSweepInterval(-1)}} {
		st := New(opts...)
		if n := sweepers(); n != 0 { // a goroutine New started is there when it returns
			t.Fatalf("New(%d options) started %d sweepers, want none", len(opts), n)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	st := New() // DefaultSweepInterval
	defer st.Close()
	if n := awaitSweepers(1); n != 1 {
		t.Fatalf("New() runs %d sweepers, want 1", n)
	}
	s, err := shaper.New(st, shaper.PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "k", 1)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if n := awaitSweepers(0); n != 0 {
		t.Fatalf("%d sweepers left after Close", n)
	}
	if err := st.Close(); err != nil { // twice is fine
		t.Fatal(err)
	}
	mustReserve(t, s, "k", 1) // the store stays usable, without its sweeper
	if n := st.Sweep(); n != 0 {
		t.Fatalf("Sweep evicted %d keys still throttled", n)
	}
}

// Close may race with the sweeper's ticks and with other calls to Close.
func TestConcurrentCloseAndSweeps(t *testing.T) {
	t.Parallel()
	st := New(WithSweepInterval(time.Microsecond))
	s, err := shaper.New(st, shaper.PerSecond(1000))
	if err != nil {
		t.Fatal(err)
	}
	done, started := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			_, _ = s.Reserve(bg, strings.Repeat("k", 1+i%7), 1)
			st.Sweep()
			if i == 0 {
				close(started)
			}
		}
	}()
	<-started
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- st.Close() }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	<-done
}
