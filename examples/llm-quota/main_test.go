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
// and fails otherwise). How much more settling serves is a matter of time,
// which make bench measures; here only that both runs sent calls.
func TestLLMQuotaRuns(t *testing.T) {
	var out bytes.Buffer
	res, err := run(&out, 2*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "settling used") || res[0].Calls == 0 || res[1].Calls == 0 {
		t.Fatalf("a run sent nothing, or no summary:\n%s", out.String())
	}
}
