package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example runs to completion and exports the shaper's spans and metrics.
func TestOtelExampleRuns(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, 14); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{`"Name":"throttlekit.Wait"`, `"Name":"throttlekit.wait"`, "throttlekit.reservations", "throttlekit.delay", "queue_full", "outcomes: map[accepted:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %s", want)
		}
	}
	if t.Failed() {
		t.Log(out.String()[:min(out.Len(), 4000)])
	}
}
