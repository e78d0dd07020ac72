package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Both runs send calls and the API, counting its own trailing windows,
// refuses none of them (run fails otherwise). How much more settling
// serves is a matter of time, which make bench measures; here only that
// it serves more.
func TestLLMQuotaRuns(t *testing.T) {
	var out bytes.Buffer
	res, err := run(&out, 4*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "refused none") || res[0].Calls == 0 || res[1].Calls <= res[0].Calls {
		t.Fatalf("a run sent nothing, settling served no more, or no summary:\n%s", out.String())
	}
	t.Log(out.String())
}
