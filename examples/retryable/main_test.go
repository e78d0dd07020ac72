package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example runs to completion: every request succeeds after retries, the
// partner never sees more than the contract in a second, and the pause after
// the 503 holds (run returns an error otherwise).
func TestRetryableRuns(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, 40); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "x 503") {
		t.Fatalf("no summary:\n%s", out.String())
	}
}
