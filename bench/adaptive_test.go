package bench

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
)

// adaptive runs examples/adaptive once: r.sc.learnN processes learn,
// together through one Redis, the hidden limit of a partner that says
// nothing (40/s, 20/s, 60/s, r.sc.learnPhase each), and the report gives
// each phase's time to converge and, after it, the 429s' share and the
// accepted requests' share of the limit, against their goals.
func (r *report) adaptive(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "adaptive")
	build := exec.Command("go", "build", "-o", bin, "./examples/adaptive")
	build.Dir = ".." // the library's module, which holds the example
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the adaptive example: %v\n%s", err, out)
	}
	srv := redistest.Start(t)
	cmd := exec.Command(bin, "-procs", strconv.Itoa(r.sc.learnN), "-phase", r.sc.learnPhase.String(), "-redis", srv.Addr(), "-json")
	out, err := cmd.Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res struct {
		Procs, Goroutines, Ceiling, Start int
		Phases                            []struct {
			Limit                     float64
			Converged                 bool
			ConvergeSeconds           int
			RefusedPct, ThroughputPct float64
		}
		Seconds []struct {
			Second            int
			Limit             float64
			Learned, Found    float64
			Event             string
			Accepted, Refused int
		}
		Requests, Refused int
		RefusedPct        float64
		PerProcess        []int
		Errors            int
		FirstError        string
	}
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || jerr != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("adaptive run: %v %v\n%s%s", err, jerr, out, stderr)
	}
	r.printf("## Learning a hidden limit\n\n`examples/adaptive`: %d OS processes, %d goroutines each, send to a partner that says nothing: a token bucket of 5 whose hidden limit is 40/s, then 20/s, then 60/s, %v each, and which answers 429 without any header to a request that finds it empty. Each process's shaper has a contract of %d/s, the ceiling, and learns the rate from %d/s (`shaper.WithLearning`), through one Redis: the processes learn one rate together. One run. A phase converges at its first second (counted from 0) in which the partner accepted at least 90 %% of the limit and refused nothing; the figures after convergence run from that second to the phase's end.\n\n",
		res.Procs, res.Goroutines, r.sc.learnPhase, res.Ceiling, res.Start)
	r.printf("| phase | hidden limit | time to converge | 429s after convergence | | accepted after convergence, of the limit | |\n| ---: | ---: | ---: | ---: | --- | ---: | --- |\n")
	for i, ph := range res.Phases {
		if !ph.Converged {
			r.printf("| %d | %.0f/s | never: %s | - | | - | |\n", i+1, ph.Limit,
				r.target(false, fmt.Sprintf("learning: phase %d (%.0f/s) never converged within %v", i+1, ph.Limit, r.sc.learnPhase)))
			continue
		}
		r.printf("| %d | %.0f/s | %d s | %.2f %% | %s | %.1f %% | %s |\n", i+1, ph.Limit, ph.ConvergeSeconds,
			ph.RefusedPct, r.target(ph.RefusedPct < 1, fmt.Sprintf("learning: phase %d (%.0f/s): %.2f %% refused after convergence (target < 1 %%)", i+1, ph.Limit, ph.RefusedPct)),
			ph.ThroughputPct, r.target(ph.ThroughputPct >= 90, fmt.Sprintf("learning: phase %d (%.0f/s): %.1f %% of the limit accepted after convergence (target >= 90 %%)", i+1, ph.Limit, ph.ThroughputPct)))
	}
	r.printf("\nTargets after convergence: 429s < 1 %% of the requests, accepted >= 90 %% of the hidden limit. Over the whole run the partner answered %d requests and refused %d (%.2f %%); sent per process %v.",
		res.Requests, res.Refused, res.RefusedPct, res.PerProcess)
	if res.Errors > 0 {
		r.printf(" %d requests failed without an answer; the first: %s.", res.Errors, res.FirstError)
	}
	r.printf("\n\n<details><summary>Per second: the learned rate at the second's end, the event that last changed it, the rate the partner was last found to accept, and what the partner accepted and refused</summary>\n\n| second | hidden limit | learned /s | event | found /s | 200s | 429s |\n| ---: | ---: | ---: | --- | ---: | ---: | ---: |\n")
	for _, s := range res.Seconds {
		r.printf("| %d | %.0f | %.1f | %s | %.1f | %d | %d |\n", s.Second, s.Limit, s.Learned, s.Event, s.Found, s.Accepted, s.Refused)
	}
	r.printf("\n</details>\n")
}
