package bench

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

var (
	reportDir  = flag.String("report", "", "write BENCHMARKS.md and pacing.svg to this directory (make bench); empty: a short smoke run into a temporary directory")
	reportRuns = flag.Int("runs", 3, "runs per figure; the report gives medians")
)

// scale is how long each part of the report runs.
type scale struct {
	runs      int
	benchtime string        // for testing.Benchmark
	pacing    time.Duration // per pacing configuration
	rates     []int
	waiters   []int
	redisFor  time.Duration // per Redis configuration
	fleetFor  time.Duration
	fleetN    int
	keysBig   int
	// learning a hidden limit (adaptive_test.go): each phase's length,
	// and the processes
	learnPhase time.Duration
	learnN     int
	// giveBack: settling and cancelled slots (settle_test.go)
	cancelWaiters int
	giveBackFor   time.Duration
	giveBackWarm  time.Duration
}

var full = scale{runs: 3, benchtime: "1s", pacing: 3 * time.Second, rates: []int{100, 1000, 5000}, waiters: []int{1, 16},
	redisFor: 2 * time.Second, fleetFor: 5 * time.Second, fleetN: 4, keysBig: 1_000_000, learnPhase: 20 * time.Second, learnN: 4,
	cancelWaiters: 1000, giveBackFor: 15 * time.Second, giveBackWarm: 5 * time.Second}
var smoke = scale{runs: 1, benchtime: "2000x", pacing: 300 * time.Millisecond, rates: []int{1000}, waiters: []int{1},
	redisFor: 200 * time.Millisecond, fleetFor: time.Second, fleetN: 2, keysBig: 20_000, learnPhase: 3 * time.Second, learnN: 2,
	cancelWaiters: 100, giveBackFor: 1500 * time.Millisecond, giveBackWarm: 500 * time.Millisecond}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// report collects the figures and renders them.
type report struct {
	sc   scale
	md   bytes.Buffer
	svg  string
	fail []string // targets missed, for the summary
}

func (r *report) printf(format string, a ...any) { fmt.Fprintf(&r.md, format, a...) }

func (r *report) target(ok bool, what string) string {
	if ok {
		return "met"
	}
	r.fail = append(r.fail, what)
	return "**missed**"
}

// TestReport measures everything the report shows and writes it. Without
// -report it is a smoke run of the same code at a tiny scale, writing into a
// temporary directory, so that `make test` keeps the report working.
func TestReport(t *testing.T) {
	sc, dir := smoke, t.TempDir()
	if *reportDir != "" {
		sc, dir = full, *reportDir
		sc.runs = max(1, *reportRuns)
	}
	if err := flag.Set("test.benchtime", sc.benchtime); err != nil {
		t.Fatal(err)
	}
	r := &report{sc: sc}
	started := time.Now()
	r.header()
	r.inProcess(t)
	r.keyed(t)
	r.pacing(t)
	r.giveBack(t)
	r.redis(t)
	r.inflight(t)
	r.fair(t)
	r.fleet(t)
	r.partners(t)
	r.adaptive(t)
	r.printf("\n## Targets missed\n\n")
	if len(r.fail) == 0 {
		r.printf("None.\n")
	}
	for _, f := range r.fail {
		r.printf("* %s\n", f)
	}
	r.printf("\nThe whole report took %v.\n", time.Since(started).Round(time.Second))
	if err := os.WriteFile(filepath.Join(dir, "BENCHMARKS.md"), r.md.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pacing.svg"), []byte(r.svg), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## In-process", "## Keyed", "## Pacing", "## Settle and cancel", "## Redis", "## In-flight on Redis", "## Fair turns", "## Fleet", "## The partner's own count", "## Learning a hidden limit"} {
		if !strings.Contains(r.md.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if !strings.HasPrefix(r.svg, "<svg") || !strings.Contains(r.svg, "throttlekit") {
		t.Errorf("pacing.svg is not a chart: %.80q", r.svg)
	}
	t.Logf("wrote %s in %v", dir, time.Since(started).Round(time.Second))
}

func (r *report) header() {
	cpu := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	versions := map[string]string{}
	for _, m := range []string{"golang.org/x/time", "go.uber.org/ratelimit", "github.com/go-redis/redis_rate/v10", "github.com/redis/go-redis/v9"} {
		if out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", m).Output(); err == nil {
			versions[m] = strings.TrimSpace(string(out))
		}
	}
	redisV := "unknown"
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		redisV = strings.TrimSpace(string(out))
	}
	r.printf("# Benchmarks\n\nWritten by `make bench` (bench/report_test.go) on %s. Every figure is the median of %d runs in this one run; ratios are ThrottleKit / anchor (below 1 is faster or smaller for costs).\n\n",
		time.Now().UTC().Format("2006-01-02"), r.sc.runs)
	r.printf("| machine | |\n| --- | --- |\n| CPU | %s, %d cores (GOMAXPROCS %d) |\n| Go | %s %s/%s |\n| Redis | %s |\n", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, redisV)
	for _, m := range []string{"golang.org/x/time", "go.uber.org/ratelimit", "github.com/go-redis/redis_rate/v10", "github.com/redis/go-redis/v9"} {
		r.printf("| %s | %s |\n", m, versions[m])
	}
	r.printf("\n")
}

// bench runs f runs times with testing.Benchmark and returns the median
// ns/op and allocs/op.
func (r *report) bench(f func(b *testing.B)) (ns, allocs float64) {
	var nss, as []float64
	for range r.sc.runs {
		res := testing.Benchmark(f)
		nss = append(nss, float64(res.T.Nanoseconds())/float64(max(res.N, 1)))
		as = append(as, float64(res.AllocsPerOp()))
	}
	return median(nss), median(as)
}

func (r *report) inProcess(t *testing.T) {
	r.printf("## In-process\n\nOne limiter, a contract no call reaches, so every call is admitted. ThrottleKit's memory store goes through its keyed lookup on one hot key; x/time/rate is one `*rate.Limiter` (`AllowN(time.Now(), 1)`, `ReserveN`); uber's is `Take` at 10^9/s without slack (it never sleeps). Parallel: `b.RunParallel` on %d procs.\n\n", runtime.GOMAXPROCS(0))
	r.printf("| operation | ns/op | allocs/op | ns/op parallel |\n| --- | ---: | ---: | ---: |\n")
	res := map[string]float64{}
	for _, c := range inProcess {
		ns, allocs := r.bench(func(b *testing.B) {
			op := c.op(b)
			b.ReportAllocs()
			for b.Loop() {
				op()
			}
		})
		pns, _ := r.bench(func(b *testing.B) {
			op := c.op(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					op()
				}
			})
		})
		res[c.name], res[c.name+"/allocs"] = ns, allocs
		r.printf("| %s | %.1f | %.0f | %.1f |\n", c.name, ns, allocs, pns)
	}
	ratio := res["throttlekit-reserve"] / res["xrate-allown"]
	r.printf("\nTarget: Reserve on a hot key <= 1.0x x/time/rate AllowN, 0 allocs. Ratio **%.2fx**, %.0f allocs: %s.\n\n", ratio, res["throttlekit-reserve/allocs"],
		r.target(ratio <= 1.0 && res["throttlekit-reserve/allocs"] == 0, fmt.Sprintf("hot-key Reserve is %.2fx x/time/rate AllowN (target 1.0x)", ratio)))
}

func (r *report) keyed(t *testing.T) {
	r.printf("## Keyed\n\nA reservation on one of n existing keys, in key order: the memory store beside a mutex-guarded `map[string]*rate.Limiter`. Bytes per key: live heap after creating %d keys, key strings included.\n\n", r.sc.keysBig)
	r.printf("| keys | throttlekit ns/op | map of rate.Limiter ns/op | ratio |\n| ---: | ---: | ---: | ---: |\n")
	var ratio10k float64
	for _, n := range []int{10_000, r.sc.keysBig} {
		keys := keyNames(n)
		var ns [2]float64
		for i, lib := range []string{"throttlekit", "xrate-map"} {
			ns[i], _ = r.bench(func(b *testing.B) {
				op := keyed(b, lib, keys)
				j := 0
				for b.Loop() {
					op(j)
					j++
				}
			})
		}
		if n == 10_000 {
			ratio10k = ns[0] / ns[1]
		}
		r.printf("| %d | %.1f | %.1f | %.2fx |\n", n, ns[0], ns[1], ns[0]/ns[1])
	}
	var tk, xm []float64
	for range r.sc.runs {
		tk = append(tk, bytesPerKey(t, "throttlekit", r.sc.keysBig))
		xm = append(xm, bytesPerKey(t, "xrate-map", r.sc.keysBig))
	}
	bt, bx := median(tk), median(xm)
	r.printf("\n| bytes per live key | throttlekit | map of rate.Limiter | ratio |\n| --- | ---: | ---: | ---: |\n| memory | %.1f | %.1f | %.2fx |\n\n", bt, bx, bt/bx)
	r.printf("Targets: 10,000 keys <= 0.8x the map: **%.2fx**, %s. Bytes per key <= 0.6x the map: **%.2fx**, %s.\n\n",
		ratio10k, r.target(ratio10k <= 0.8, fmt.Sprintf("10,000 keys: %.2fx the map of rate.Limiter (target 0.8x)", ratio10k)),
		bt/bx, r.target(bt/bx <= 0.6, fmt.Sprintf("memory bytes per key: %.2fx the map (target 0.6x)", bt/bx)))
}

func (r *report) pacing(t *testing.T) {
	r.printf("## Pacing\n\nEach limiter at a contract of N/s with burst 1 (uber: without slack) for %v, with 1 and with 16 goroutines each taking a slot and departing in a loop. ThrottleKit is `Reserve` then the sleep `Wait` uses, so that the slot is known (default: a timer; precise: a timer to 2 ms before, then yielding). x/time/rate is `ReserveN` and a timer (what `Wait` does); uber's `Take` returns its slot. Rate error: (departures-1)/(last-first) against N. Lateness: departure minus the slot the limiter gave. Most in 1 s: the most departures in any sliding 1 s window (allowed: N + 1).\n\n", r.sc.pacing)
	r.printf("| N/s | waiters | limiter | rate error | gap p50 | gap p99 | gap max | late p50 | late p99 | late max | most in 1 s |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	type key struct {
		lib  string
		rate int
		w    int
	}
	p99 := map[key]float64{}
	errs := map[key]float64{}
	most := map[key]int{}
	var chart []pacing
	for _, n := range r.sc.rates {
		for _, w := range r.sc.waiters {
			for _, p := range pacers {
				var runs []pacing
				for range r.sc.runs {
					runs = append(runs, pace(p.make, n, w, r.sc.pacing))
				}
				med := func(f func(pacing) float64) float64 {
					var xs []float64
					for _, x := range runs {
						xs = append(xs, f(x))
					}
					return median(xs)
				}
				d := func(f func(pacing) time.Duration) time.Duration {
					return time.Duration(med(func(p pacing) float64 { return float64(f(p)) }))
				}
				k := key{p.name, n, w}
				errs[k] = med(func(p pacing) float64 { return p.errPct })
				p99[k] = med(func(p pacing) float64 { return float64(p.lateP99) })
				m := 0
				for _, x := range runs {
					m = max(m, x.mostIn1s)
				}
				most[k] = m
				r.printf("| %d | %d | %s | %+.2f%% | %v | %v | %v | %v | %v | %v | %d |\n", n, w, p.name, errs[k],
					d(func(p pacing) time.Duration { return p.gapP50 }).Round(time.Microsecond), d(func(p pacing) time.Duration { return p.gapP99 }).Round(time.Microsecond),
					d(func(p pacing) time.Duration { return p.gapMax }).Round(time.Microsecond), d(func(p pacing) time.Duration { return p.lateP50 }).Round(time.Microsecond),
					d(func(p pacing) time.Duration { return p.lateP99 }).Round(time.Microsecond), d(func(p pacing) time.Duration { return p.lateMax }).Round(time.Microsecond), m)
				if n == 1000 && w == 1 {
					chart = append(chart, runs[0])
				}
			}
		}
	}
	r.printf("\nMost in 1 s is the largest over the runs, not the median.\n\n")
	r.printf("| target | result | |\n| --- | --- | --- |\n")
	for _, mode := range []string{"throttlekit", "throttlekit-precise"} {
		for _, n := range r.sc.rates {
			for _, w := range r.sc.waiters {
				e := errs[key{mode, n, w}]
				r.printf("| %s: rate within 0.5%% at %d/s, %d waiters | %+.2f%% | %s |\n", mode, n, w, e,
					r.target(e >= -0.5 && e <= 0.5, fmt.Sprintf("%s rate error at %d/s with %d waiters: %+.2f%% (target ±0.5%%)", mode, n, w, e)))
				m := most[key{mode, n, w}]
				r.printf("| %s: at most %d departures in any 1 s at %d/s, %d waiters | %d | %s |\n", mode, n+1, n, w, m,
					r.target(m <= n+1, fmt.Sprintf("%s most in 1 s at %d/s with %d waiters: %d (allowed %d)", mode, n, w, m, n+1)))
			}
		}
	}
	for _, n := range r.sc.rates {
		for _, w := range r.sc.waiters {
			xr := p99[key{"xrate", n, w}]
			for _, c := range []struct {
				mode  string
				limit float64
			}{{"throttlekit-precise", 0.25}, {"throttlekit", 1.0}} {
				ratio := p99[key{c.mode, n, w}] / xr
				r.printf("| %s: lateness p99 <= %.2fx x/time/rate's at %d/s, %d waiters | %.2fx | %s |\n", c.mode, c.limit, n, w, ratio,
					r.target(ratio <= c.limit, fmt.Sprintf("%s lateness p99 at %d/s with %d waiters: %.2fx x/time/rate's (target %.2fx)", c.mode, n, w, ratio, c.limit)))
			}
		}
	}
	r.printf("\n![departures per 100 ms at 1,000/s, one waiter](pacing.svg)\n\n")
	var names []string
	for _, p := range pacers[:len(chart)] {
		names = append(names, p.name)
	}
	r.svg = chartSVG(chart, names)
}

// chartSVG draws departures per 100 ms for each limiter's run at 1,000/s as
// lines, by hand: no plotting dependency.
func chartSVG(runs []pacing, names []string) string {
	const w, h, left, bottom, top, right = 760, 360, 60, 40, 30, 170
	n := 0
	for _, p := range runs {
		if len(p.departures) > 0 {
			n = max(n, int(p.departures[len(p.departures)-1].Sub(p.start)/(100*time.Millisecond))+1)
		}
	}
	n = max(n-1, 2) // the last bucket is partial
	maxY := 120.0
	x := func(i int) float64 { return left + float64(i)*float64(w-left-right)/float64(n-1) }
	y := func(v float64) float64 { return float64(h-bottom) - v/maxY*float64(h-bottom-top) }
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&s, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&s, `<text x="%d" y="18" font-size="14">Departures per 100 ms, contract 1,000/s (100 per bucket), one waiter</text>`+"\n", left)
	for _, v := range []float64{0, 20, 40, 60, 80, 100, 120} {
		fmt.Fprintf(&s, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left, y(v), w-right, y(v), left-6, y(v)+4, v)
	}
	for i := 0; i < n; i += 5 {
		fmt.Fprintf(&s, `<text x="%.1f" y="%d" text-anchor="middle">%.1fs</text>`+"\n", x(i), h-bottom+16, float64(i)/10)
	}
	colors := []string{"#d62728", "#9467bd", "#1f77b4", "#2ca02c"}
	for k, p := range runs {
		counts := p.perBucket(100*time.Millisecond, n)
		var pts []string
		for i, c := range counts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(float64(c))))
		}
		fmt.Fprintf(&s, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[k%len(colors)], strings.Join(pts, " "))
		fmt.Fprintf(&s, `<rect x="%d" y="%d" width="14" height="4" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", w-right+10, top+20*k+4, colors[k%len(colors)], w-right+30, top+20*k+10, names[k])
	}
	s.WriteString("</svg>\n")
	return s.String()
}

// redisThroughput runs op from g goroutines for d and returns ops/s, the
// latency p50 and p99, and how many operations ran.
func redisThroughput(t *testing.T, g int, d time.Duration, op func(i int) error) (float64, time.Duration, time.Duration, int) {
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for w := range g {
		wg.Go(func() {
			var lat []time.Duration
			for i := w; time.Now().Before(end); i += g {
				t0 := time.Now()
				if err := op(i); err != nil {
					t.Error(err)
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(all)
	if len(all) == 0 {
		return 0, 0, 0, 0
	}
	return float64(len(all)) / elapsed.Seconds(), all[len(all)/2], all[len(all)*99/100], len(all)
}

// serverCost returns what the server spent on scripts since its statistics
// were last reset (CONFIG RESETSTAT): the microseconds of CPU its
// commandstats count for EVALSHA and EVAL, and how many calls.
func serverCost(t *testing.T, c *redis.Client) (usec float64, calls int64) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "usec":
				x, _ := strconv.ParseFloat(v, 64)
				usec += x
			case "calls":
				n, _ := strconv.ParseInt(v, 10, 64)
				calls += n
			}
		}
	}
	return usec, calls
}

// redisOp is one operation of the Redis tables.
type redisOp struct {
	name string
	op   func(i int) error
}

// redisFigures are the medians of one operation's runs: ops/s, p50 and p99
// latency (ns), server CPU per operation (µs, commandstats) and operations
// per script call.
type redisFigures struct{ tp, p50, p99, usec, perCall float64 }

// redisRuns measures ops at g goroutines: each first unmeasured (so that the
// pool holds g connections and the keys exist), then the runs interleave
// the operations in a rotated order each run, so that none is always first
// or always measured after the others. The server's statistics are reset
// before each run and read after it.
func (r *report) redisRuns(t *testing.T, c *redis.Client, g int, ops []redisOp) map[string]redisFigures {
	for _, o := range ops {
		redisThroughput(t, g, r.sc.redisFor/10, o.op)
	}
	figs := make([][5][]float64, len(ops))
	for run := range r.sc.runs {
		for k := range ops {
			k = (k + run) % len(ops)
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			tp, p50, p99, n := redisThroughput(t, g, r.sc.redisFor, ops[k].op)
			usec, calls := serverCost(t, c)
			f := &figs[k]
			f[0], f[1], f[2] = append(f[0], tp), append(f[1], float64(p50)), append(f[2], float64(p99))
			f[3], f[4] = append(f[3], usec/float64(max(n, 1))), append(f[4], float64(n)/float64(max(calls, 1)))
		}
	}
	res := map[string]redisFigures{}
	for k, o := range ops {
		f := figs[k]
		res[o.name] = redisFigures{median(f[0]), median(f[1]), median(f[2]), median(f[3]), median(f[4])}
	}
	return res
}

// redisRows prints the rows of ops at g goroutines.
func (r *report) redisRows(g int, ops []redisOp, res map[string]redisFigures) {
	rr, floor := res["redis_rate Allow"], res["no-op EVALSHA"]
	for _, o := range ops {
		v := res[o.name]
		r.printf("| %d | %s | %.0f | %v | %v | %.2fx | %.2fx | %.2f | %.1f |\n", g, o.name, v.tp,
			time.Duration(v.p50).Round(time.Microsecond), time.Duration(v.p99).Round(time.Microsecond),
			v.tp/rr.tp, v.tp/floor.tp, v.usec, v.perCall)
	}
}

func (r *report) redis(t *testing.T) {
	srv := redistest.Start(t)
	c := client(srv) // pool 128, ContextTimeoutEnabled: the configuration docs/REDIS.md recommends
	s, err := shaper.New(redisstore.New(c), open)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := shaper.New(redisstore.New(c, redisstore.WithCoalescing(false)), open, shaper.WithPrefix("alone:"))
	if err != nil {
		t.Fatal(err)
	}
	rr := redis_rate.NewLimiter(c)
	limit := rrLimit
	noop := redis.NewScript("return 1")
	names := keyNames(keys)
	const (
		tk    = "throttlekit Reserve"
		tk1   = "throttlekit Reserve, one call each"
		rrOp  = "redis_rate Allow"
		floor = "no-op EVALSHA"
	)
	on := func(key func(i int) string) []redisOp {
		return []redisOp{
			{tk, func(i int) error { _, err := s.Reserve(ctx, key(i), 1); return err }},
			{tk1, func(i int) error { _, err := alone.Reserve(ctx, key(i), 1); return err }},
			{rrOp, func(i int) error { _, err := rr.Allow(ctx, key(i), limit); return err }},
			{floor, func(i int) error { return noop.Run(ctx, c, []string{key(i)}).Err() }},
		}
	}
	r.printf("## Redis\n\nOne redis-server on loopback started for the run; limits no call reaches; the client's pool is 128, with ContextTimeoutEnabled (the recommended configuration: the store then applies its timeout on the socket, with no goroutine per call). Each configuration runs %v per run, after an unmeasured warm-up; the runs interleave the operations in a rotated order. ThrottleKit's Reserve coalesces (the default: reservations made while a call is in flight go together in the next call); \"one call each\" is the same store WithCoalescing(false). Server µs per op is the CPU Redis's `INFO commandstats` counts for EVALSHA and EVAL, divided by the operations; ops per call is operations per script call.\n\n", r.sc.redisFor)
	header := "| goroutines | operation | ops/s | p50 | p99 | ratio to redis_rate | ratio to no-op | server µs per op | ops per call |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
	r.printf("### %d keys\n\n%s", keys, header)
	spread := on(func(i int) string { return names[i%keys] })
	var at1, at64 map[string]redisFigures
	for _, g := range []int{1, 8, 64} {
		res := r.redisRuns(t, c, g, spread)
		r.redisRows(g, spread, res)
		switch g {
		case 1:
			at1 = res
		case 64:
			at64 = res
		}
	}
	hot := on(func(int) string { return "hot" })
	r.printf("\n### One key\n\n%s", header)
	atHot := r.redisRuns(t, c, 64, hot)
	r.redisRows(64, hot, atHot)
	a, b := at64[tk].tp/at64[rrOp].tp, at64[tk].tp/at64[floor].tp
	h := atHot[tk].tp / atHot[rrOp].tp
	p := at1[tk].p50 / at1[tk1].p50
	r.printf("\nTargets: at 64 goroutines over %d keys, >= 2.0x redis_rate: **%.2fx**, %s; >= 1.5x the no-op floor: **%.2fx**, %s. One key at 64 goroutines, >= 5x redis_rate: **%.2fx**, %s. One goroutine, p50 within 1.1x of one call each: **%.2fx**, %s.\n",
		keys, a, r.target(a >= 2, fmt.Sprintf("Redis throughput at 64 goroutines: %.2fx redis_rate (target 2.0x)", a)),
		b, r.target(b >= 1.5, fmt.Sprintf("Redis throughput at 64 goroutines: %.2fx the no-op EVALSHA (target 1.5x)", b)),
		h, r.target(h >= 5, fmt.Sprintf("Redis throughput on one key at 64 goroutines: %.2fx redis_rate (target 5x)", h)),
		p, r.target(p <= 1.1, fmt.Sprintf("Redis p50 at 1 goroutine: %.2fx one call each (target 1.1x)", p)))
	r.printf("Server CPU per reservation at 64 goroutines over %d keys: %.2f µs coalesced, %.2f µs one call each, %.2f µs per redis_rate Allow.\n\n",
		keys, at64[tk].usec, at64[tk1].usec, at64[rrOp].usec)
	// Bytes per key on the server.
	const n = 20000
	// Unnamed, on a store of its own: keys as a default shaper writes them.
	small, err := shaper.New(redisstore.New(c), bytesRate)
	if err != nil {
		t.Fatal(err)
	}
	var tkb, rl []float64
	for range r.sc.runs {
		tkb = append(tkb, redisBytesPerKey(t, c, small, rr, "throttlekit", n))
		rl = append(rl, redisBytesPerKey(t, c, small, rr, "redis_rate", n))
	}
	bt, br := median(tkb), median(rl)
	r.printf("\n| Redis bytes per key (used_memory, %d keys) | throttlekit | redis_rate | ratio |\n| --- | ---: | ---: | ---: |\n| leaky bucket vs GCRA, 1/min, every key alive | %.1f | %.1f | %.2fx |\n\n", n, bt, br, bt/br)
	r.printf("Target: <= 1.0x redis_rate's bytes per key: **%.2fx**, %s.\n\n", bt/br, r.target(bt/br <= 1, fmt.Sprintf("Redis bytes per key: %.2fx redis_rate's (target 1.0x)", bt/br)))
}

func usedMemory(t testing.TB, c *redis.Client) int64 {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO")
	return 0
}

// perScript is the requests a fleet sent per script Redis ran (0 when the
// fleet could not count its scripts).
func perScript(perWorker []int, scripts int64) float64 {
	if scripts <= 0 {
		return 0
	}
	n := 0
	for _, w := range perWorker {
		n += w
	}
	return float64(n) / float64(scripts)
}

func (r *report) fleet(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "redis-fleet")
	build := exec.Command("go", "build", "-o", bin, "./examples/redis-fleet")
	build.Dir = ".." // the library's module, which holds the example
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the fleet example: %v\n%s", err, out)
	}
	srv := redistest.Start(t)
	const contract = 500
	r.printf("## Fleet\n\n`examples/redis-fleet`: %d OS processes, 8 goroutines each, share %d/s through one Redis for %v; each request stamps its departure, and the partner records departures and arrivals.\n\n", r.sc.fleetN, contract, r.sc.fleetFor)
	r.printf("| run | aggregate /s | error | most departures in 1 s | most arrivals in 1 s | per process | requests per Redis script |\n| ---: | ---: | ---: | ---: | ---: | --- | ---: |\n")
	type result struct {
		Rate        float64
		ErrorPct    float64
		MostIn1s    int
		MostArr1s   int
		PerWorker   []int
		ScriptCalls int64
	}
	var errs []float64
	worst := 0
	for i := range r.sc.runs {
		cmd := exec.Command(bin, "-procs", strconv.Itoa(r.sc.fleetN), "-rate", strconv.Itoa(contract), "-duration", r.sc.fleetFor.String(), "-redis", srv.Addr(), "-json")
		out, err := cmd.Output()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var res result
		if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &res); jerr != nil {
			t.Fatalf("fleet run: %v %v\n%s", err, jerr, out)
		}
		errs = append(errs, res.ErrorPct)
		worst = max(worst, res.MostArr1s, res.MostIn1s)
		r.printf("| %d | %.1f | %+.2f%% | %d | %d | %v | %.2f |\n", i+1, res.Rate, res.ErrorPct, res.MostIn1s, res.MostArr1s, res.PerWorker, perScript(res.PerWorker, res.ScriptCalls))
	}
	e := median(errs)
	r.printf("\nTargets: aggregate within 1%% of %d/s: median **%+.2f%%**, %s; never above %d in any 1 s window: worst **%d**, %s. ",
		contract, e, r.target(e >= -1 && e <= 1, fmt.Sprintf("fleet aggregate error %+.2f%% (target ±1%%)", e)),
		contract+1, worst, r.target(worst <= contract+1, fmt.Sprintf("fleet: %d in one 1 s window (allowed %d)", worst, contract+1)))
	r.printf("The slots never exceed the contract; departures add each process's wake-up lateness (docs/SHAPER.md, \"Slots and departures\").\n")
}
