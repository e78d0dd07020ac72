package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The demo runs to completion: the shaped client gets no 429 (run returns an
// error otherwise) and the plain one is throttled.
func TestQuickstartRuns(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var plainLine string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "plain client ") && strings.Contains(line, fmt.Sprintf("  %d ", requests)) {
			plainLine = line
		}
	}
	fields := strings.Fields(plainLine)
	if len(fields) < 6 || fields[4] == "0" {
		t.Fatalf("the plain client was not throttled: %q\n%s", plainLine, out.String())
	}
}
