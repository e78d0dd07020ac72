package main

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestWorkerpoolRuns(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "acme    40 jobs") || !strings.Contains(out.String(), "globex  20 jobs") {
		t.Fatalf("unexpected summary:\n%s", out.String())
	}
}
