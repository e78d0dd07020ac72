package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Both runs stay inside both limits (run checks the API's recorded windows
// and fails otherwise), and settling serves more of the token contract than
// keeping the estimates (make bench measures by how much).
func TestLLMQuotaRuns(t *testing.T) {
	var out bytes.Buffer
	res, err := run(&out, 2*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "settling used") {
		t.Fatalf("no summary:\n%s", out.String())
	}
	if res[1].Calls <= res[0].Calls {
		t.Fatalf("settling sent %d calls, keeping the estimates %d:\n%s", res[1].Calls, res[0].Calls, out.String())
	}
}
