package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example runs to completion inside both limits (run checks the API's
// recorded windows and fails otherwise).
func TestLLMQuotaRuns(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, 30); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "most in any 1 s window") {
		t.Fatalf("no summary:\n%s", out.String())
	}
}
