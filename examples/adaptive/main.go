// Command adaptive shows a fleet learning a partner's rate limit that
// nobody told it. The parent starts a partner on loopback: a token bucket
// of 5 tokens whose hidden limit follows a schedule (-limits, by default
// 40/s, then 20/s, then 60/s, changing every -phase), which answers 429 to
// a request that finds the bucket empty, with no rate-limit header and no
// Retry-After: a partner that says nothing. It records every arrival and
// its status. The parent starts a redis-server on a free port (unless
// -redis is given), then -procs copies of itself.
//
// Each copy runs a shaper on Redis whose contract is only a ceiling
// (-ceiling, 200/s) and which learns the rate (shaper.WithLearning, from
// -start, 10/s), and an http.Client through transport.New, which feeds every
// response to the shaper; -goroutines goroutines per process send requests
// to the partner in a loop, all on one partner key. So the processes learn
// one rate together, through Redis. The parent reads that rate once a
// second through a learning shaper of its own on the same Redis and key
// (Status(...).Learned) and prints a line per second: the second, the
// partner's hidden limit then, the learned rate at the second's end, the
// event that last changed it, the rate the partner was last found to
// accept, and the requests the partner accepted (200) and refused (429) in
// that second.
//
// At the end it prints, per phase, the hidden limit and
//
//   - the time to converge: the phase's seconds are counted from 0 at its
//     start; the phase converges at the first of them in which the partner
//     accepted at least 90 % of the phase's hidden limit and refused
//     nothing, and the time to converge is that second's number (0: the
//     phase's first second already did; never: no second did);
//   - from that second to the phase's end: the 429s as a share of the
//     requests (goal < 1 %), and the requests accepted per second as a
//     share of the hidden limit (goal >= 90 %).
//
// With -json the last line is a JSON object (Result) with those figures
// and the per-second series.
//
// With -partner URL no partner is started: the processes send to URL (an
// nginx with limit_req, say), and the run is one phase of -phase against
// the fixed limit -limit (per second), which only the figures use. The
// processes then report each response (its departure and status) to the
// parent, which counts those instead of the partner's arrivals.
//
// -learn=false runs a plain shaper at -ceiling instead, without learning:
// what happens without it.
//
//	go run ./examples/adaptive [-procs 4] [-goroutines 16] [-phase 20s] [-limits 40,20,60] [-ceiling 200] [-start 10] [-redis host:port] [-json] [-short]
//	go run ./examples/adaptive -short
//	go run ./examples/adaptive -learn=false -short
//	go run ./examples/adaptive -partner http://127.0.0.1:8080/ -limit 25 -ceiling 100 -start 100 -phase 12s
//
// Without -redis it needs redis-server on PATH (Debian: apt-get install
// redis-server).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/examples/internal/redisproc"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

// workerEnv marks a child process; its value is the process's number.
const workerEnv = "THROTTLEKIT_ADAPTIVE_WORKER"

// burst is the built-in partner's bucket: how many requests it admits at
// once after a quiet spell.
const burst = 5

// Goals after convergence (see the package doc).
const (
	convergeShare = 0.90 // a second converges with this share of the limit accepted, and no 429
	goalRefused   = 1.0  // %: 429s as a share of the requests, below
	goalThrough   = 90.0 // %: accepted per second as a share of the limit, at least
)

type config struct {
	procs      int
	goroutines int
	phase      time.Duration
	limits     []float64 // the built-in partner's schedule, per second
	ceiling    int
	start      int
	learn      bool
	redis      string
	partner    string  // an external partner's URL ("": the built-in one)
	limit      float64 // its limit, for the figures

	// lead is how long before the run starts the processes are started
	// (0: a second): they start sending together at the run's start.
	lead time.Duration
}

func main() {
	c := config{learn: true}
	short := flag.Bool("short", false, "a quick run: phases of 6 s")
	flag.IntVar(&c.procs, "procs", 4, "processes learning the rate together")
	flag.IntVar(&c.goroutines, "goroutines", 16, "goroutines per process sending requests")
	flag.DurationVar(&c.phase, "phase", 20*time.Second, "how long each limit of the schedule holds (whole seconds)")
	limits := flag.String("limits", "40,20,60", "the built-in partner's hidden limits, per second, one per phase")
	flag.IntVar(&c.ceiling, "ceiling", 200, "the shaper's contract: the learned rate's ceiling, per second")
	flag.IntVar(&c.start, "start", 10, "the learned rate's start, per second (Learning.Start)")
	flag.BoolVar(&c.learn, "learn", true, "learn the rate (false: a plain shaper at -ceiling)")
	flag.StringVar(&c.redis, "redis", "", "Redis address (default: start redis-server on a free port)")
	flag.StringVar(&c.partner, "partner", "", "send to this URL instead of the built-in partner (one phase at -limit)")
	flag.Float64Var(&c.limit, "limit", 0, "with -partner: its limit per second, for the figures")
	asJSON := flag.Bool("json", false, "end with the figures and the per-second series as one JSON line (for make bench)")
	// A child's part of the run (set by the parent).
	var w workerConfig
	flag.StringVar(&w.url, "url", "", "the partner's URL (set by the parent for its processes)")
	flag.StringVar(&w.key, "key", "", "the partner key (set by the parent)")
	flag.Int64Var(&w.at, "at", 0, "when to start sending, unix ns (set by the parent)")
	flag.DurationVar(&w.run, "run", 0, "how long to send (set by the parent)")
	flag.Parse()
	if *short {
		c.phase = 6 * time.Second
	}
	var err error
	if id := os.Getenv(workerEnv); id != "" {
		w.config = c
		err = worker(id, w)
	} else {
		c.limits, err = parseLimits(*limits)
		if err == nil {
			var res Result
			res, err = run(os.Stdout, c)
			if *asJSON && len(res.Seconds) > 0 {
				_ = json.NewEncoder(os.Stdout).Encode(res)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "adaptive:", err)
		os.Exit(1)
	}
}

func parseLimits(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("-limits %q: want rates per second > 0, separated by commas", s)
		}
		out = append(out, v)
	}
	return out, nil
}

// newShaper is the shaper every process runs, and the one the parent reads
// the learned rate with: learning from -start under the ceiling, or, with
// -learn=false, a plain shaper at the ceiling.
func newShaper(client redis.UniversalClient, c config) (*shaper.Shaper, *redisstore.Store, error) {
	// A call that cannot reach Redis within a second fails (the default
	// policy is FailClosed); the default 250 ms is tighter than a loaded
	// 2-core machine running the parent, the processes and Redis needs.
	store := redisstore.New(client, redisstore.WithTimeout(time.Second))
	opts := []shaper.Option{shaper.WithMaxQueue(time.Minute)}
	if c.learn {
		opts = append(opts, shaper.WithLearning(shaper.Learning{Start: shaper.PerSecond(int64(c.start))}))
	}
	s, err := shaper.New(store, shaper.PerSecond(int64(c.ceiling)), opts...)
	if err != nil {
		_ = store.Close()
		return nil, nil, err
	}
	return s, store, nil
}

// workerConfig is a child's part of the run.
type workerConfig struct {
	config
	url string
	key string
	at  int64 // unix ns
	run time.Duration
}

// worker is one process: from w.at for w.run it sends requests to w.url
// from its goroutines, each paced by the shaper, and writes every response
// to stdout ("r <departure unix ns> <status>"), and every failure ("e
// <message>").
func worker(id string, w workerConfig) error {
	client := redis.NewClient(&redis.Options{Addr: w.redis, PoolSize: max(16, w.goroutines)})
	defer client.Close()
	s, store, err := newShaper(client, w.config)
	if err != nil {
		return err
	}
	defer store.Close()
	out := &lines{w: bufio.NewWriter(os.Stdout)}
	defer out.flush()
	base := &http.Transport{MaxIdleConns: w.goroutines, MaxIdleConnsPerHost: w.goroutines}
	defer base.CloseIdleConnections()
	tr := transport.New(s, transport.WithKey(func(*http.Request) string { return w.key }),
		transport.WithBase(recorder{base, out}))
	httpClient := &http.Client{Transport: tr}

	start := time.Unix(0, w.at)
	if late := time.Since(start); late > 50*time.Millisecond {
		out.printf("late %d\n", late.Milliseconds())
	}
	time.Sleep(time.Until(start))
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(w.run))
	defer cancel()
	// The lines reach the parent at least every 100 ms, for its
	// per-second lines.
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				out.flush()
			}
		}
	}()
	var wg sync.WaitGroup
	for range w.goroutines {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, w.url, nil)
				req.Header.Set("X-Worker", id)
				resp, err := httpClient.Do(req)
				if err != nil {
					if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
						return // the run is over, or this goroutine's slot would fall after it
					}
					out.printf("e %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
					time.Sleep(100 * time.Millisecond)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	return nil
}

// lines is a child's stdout, shared by its goroutines.
type lines struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (l *lines) printf(format string, a ...any) {
	l.mu.Lock()
	fmt.Fprintf(l.w, format, a...)
	l.mu.Unlock()
}

func (l *lines) flush() {
	l.mu.Lock()
	_ = l.w.Flush()
	l.mu.Unlock()
}

// recorder sends each request through base and records its departure
// (after its slot's wait) and the partner's status.
type recorder struct {
	base http.RoundTripper
	out  *lines
}

func (r recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	dep := time.Now()
	resp, err := r.base.RoundTrip(req)
	if err == nil {
		r.out.printf("r %d %d\n", dep.UnixNano(), resp.StatusCode)
	}
	return resp, err
}

// partner is the built-in partner: a token bucket of burst tokens whose
// refill rate follows limits, one per phase from start (the first before
// it, the last after the schedule), refusing with a bare 429 what finds
// it empty. It records every arrival.
type partner struct {
	start  time.Time
	phase  time.Duration
	limits []float64

	mu       sync.Mutex
	tokens   float64
	last     time.Time
	arrivals []arrival
}

// arrival is one response: when (the partner's arrival, or the child's
// departure), its status, and the process that sent it (0: unknown).
type arrival struct {
	at   time.Time
	ok   bool
	proc int
}

func (p *partner) index(t time.Time) int {
	i := int(math.Floor(float64(t.Sub(p.start)) / float64(p.phase)))
	return min(max(i, 0), len(p.limits)-1)
}

// refill brings the bucket up to now, phase by phase; p.mu is held.
func (p *partner) refill(now time.Time) {
	for p.last.Before(now) {
		i := p.index(p.last)
		seg := now
		if i < len(p.limits)-1 {
			if b := p.start.Add(time.Duration(i+1) * p.phase); b.Before(seg) {
				seg = b
			}
		}
		p.tokens = min(burst, p.tokens+p.limits[i]*seg.Sub(p.last).Seconds())
		p.last = seg
	}
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	proc, _ := strconv.Atoi(r.Header.Get("X-Worker"))
	p.mu.Lock()
	p.refill(now)
	ok := p.tokens >= 1-1e-9
	if ok {
		p.tokens = max(p.tokens-1, 0)
	}
	p.arrivals = append(p.arrivals, arrival{now, ok, proc})
	p.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusTooManyRequests) // no Retry-After, no rate-limit header
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

// Result is what the parent measured.
type Result struct {
	Procs        int
	Goroutines   int
	Learn        bool
	Ceiling      int
	Start        int
	PhaseSeconds int
	Partner      string    // "built-in", or the -partner URL
	Began        time.Time // the run's start: second 0
	Phases       []Phase
	Seconds      []Second
	// Over the whole run: the requests the partner answered, those it
	// refused, and the refusals' share in percent.
	Requests   int
	Refused    int
	RefusedPct float64
	PerProcess []int // requests sent, per process
	Errors     int   // requests that failed without an answer (not the run's end)
	FirstError string
}

// Phase is one phase's figures (see the package doc).
type Phase struct {
	Limit float64 // the hidden limit, per second
	// Converged reports whether the phase converged, and ConvergeSeconds
	// its time to converge (-1: never).
	Converged       bool
	ConvergeSeconds int
	// After convergence, to the phase's end: the 429s' share of the
	// requests and the accepted requests per second's share of the limit,
	// in percent (0 when the phase never converged).
	RefusedPct    float64
	ThroughputPct float64
	Accepted      int
	Refused       int
}

// Second is one second of the run.
type Second struct {
	Second   int
	Limit    float64 // the partner's hidden limit
	Learned  float64 // the learned rate at the second's end (0: not learning or unread)
	Found    float64 // the rate the partner was last found to accept (0: not yet)
	Event    string  // what last changed the learned rate
	Accepted int
	Refused  int
}

// run starts the partner (unless c.partner), Redis (unless c.redis) and the
// processes, prints the per-second lines and the per-phase figures, and
// returns them.
func run(w io.Writer, c config) (Result, error) {
	if c.procs < 1 || c.goroutines < 1 || c.ceiling < 1 || c.start < 1 {
		return Result{}, errors.New("need -procs, -goroutines, -ceiling and -start >= 1")
	}
	if c.phase < 2*time.Second || c.phase%time.Second != 0 {
		return Result{}, fmt.Errorf("-phase %v: want whole seconds, at least 2", c.phase)
	}
	if c.partner != "" {
		if !(c.limit > 0) {
			return Result{}, errors.New("-partner needs -limit, the partner's limit per second, for the figures")
		}
		c.limits = []float64{c.limit}
	}
	if len(c.limits) == 0 {
		c.limits = []float64{40, 20, 60}
	}
	if c.lead <= 0 {
		c.lead = time.Second
	}
	if c.redis == "" {
		addr, stop, err := redisproc.Start(false)
		if err != nil {
			return Result{}, err
		}
		defer stop()
		c.redis = addr
	}
	client := redis.NewClient(&redis.Options{Addr: c.redis})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil {
		return Result{}, fmt.Errorf("redis at %s: %w", c.redis, err)
	}
	mon, store, err := newShaper(client, c)
	if err != nil {
		return Result{}, err
	}
	defer store.Close()

	total := time.Duration(len(c.limits)) * c.phase
	secs := int(total / time.Second)
	begin := time.Now().Add(c.lead).Truncate(time.Millisecond)
	// A key of its own: no earlier run's learned record or budget counts.
	key := "partner-" + strconv.FormatInt(begin.UnixNano(), 36)
	defer forget(client, key)

	res := Result{Procs: c.procs, Goroutines: c.goroutines, Learn: c.learn, Ceiling: c.ceiling, Start: c.start,
		PhaseSeconds: int(c.phase / time.Second), Partner: "built-in", Began: begin}
	url := c.partner
	var p *partner
	if c.partner == "" {
		p = &partner{start: begin, phase: c.phase, limits: c.limits, tokens: burst, last: time.Now()}
		srv := httptest.NewServer(p)
		defer srv.Close()
		url = srv.URL
	} else {
		res.Partner = c.partner
	}
	self, err := os.Executable()
	if err != nil {
		return Result{}, err
	}
	how := fmt.Sprintf("learning from %d/s under a ceiling of %d/s", c.start, c.ceiling)
	if !c.learn {
		how = fmt.Sprintf("a plain shaper at %d/s, not learning", c.ceiling)
	}
	if p != nil {
		fmt.Fprintf(w, "%d processes x %d goroutines, %s, through Redis at %s; a partner with hidden limits %v/s (burst %d), %v each\n",
			c.procs, c.goroutines, how, c.redis, c.limits, burst, c.phase)
	} else {
		fmt.Fprintf(w, "%d processes x %d goroutines, %s, through Redis at %s; the partner %s (limit %v/s) for %v\n",
			c.procs, c.goroutines, how, c.redis, c.partner, c.limit, c.phase)
	}

	// The processes, and what they report.
	var mu sync.Mutex
	var reported []arrival
	var errs []string
	late := map[int]string{}
	perProc := make([]int, c.procs)
	var wg sync.WaitGroup
	procErrs := make([]error, c.procs)
	failed := make(chan struct{}) // closed when a process fails: the run is cut short
	var failOnce sync.Once
	for i := range c.procs {
		cmd := exec.Command(self, "-procs", "1", "-goroutines", strconv.Itoa(c.goroutines), "-ceiling", strconv.Itoa(c.ceiling),
			"-start", strconv.Itoa(c.start), "-learn="+strconv.FormatBool(c.learn), "-redis", c.redis, "-url", url, "-key", key,
			"-at", strconv.FormatInt(begin.UnixNano(), 10), "-run", total.String())
		cmd.Env = append(os.Environ(), workerEnv+"="+strconv.Itoa(i+1))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return Result{}, err
		}
		if err := cmd.Start(); err != nil {
			return Result{}, err
		}
		wg.Go(func() {
			sc := bufio.NewScanner(stdout)
			var other []string
			for sc.Scan() {
				line := sc.Text()
				switch {
				case strings.HasPrefix(line, "r "):
					f := strings.Fields(line)
					ns, _ := strconv.ParseInt(f[1], 10, 64)
					mu.Lock()
					reported = append(reported, arrival{time.Unix(0, ns), f[2] == "200", i + 1})
					perProc[i]++
					mu.Unlock()
				case strings.HasPrefix(line, "e "):
					mu.Lock()
					errs = append(errs, fmt.Sprintf("process %d: %s", i+1, line[2:]))
					mu.Unlock()
				case strings.HasPrefix(line, "late "):
					mu.Lock()
					late[i+1] = line[5:] + " ms"
					mu.Unlock()
				default:
					other = append(other, line)
				}
			}
			if err := cmd.Wait(); err != nil {
				procErrs[i] = fmt.Errorf("process %d: %v: %s%s", i+1, err, stderr.String(), strings.Join(other, "\n"))
				failOnce.Do(func() { close(failed) })
			}
		})
	}

	// The per-second lines: the learned rate read at each second's end,
	// the line printed a little later, when the second's answers are in.
	series := make([]Second, secs)
	fmt.Fprintf(w, "\n%6s %6s %8s %-10s %8s %8s %8s\n", "second", "limit", "learned", "event", "found", "200s", "429s")
	readErrs := 0
	for i := range secs {
		end := begin.Add(time.Duration(i+1) * time.Second)
		if !sleepUntil(end, failed) {
			break
		}
		sec := Second{Second: i, Limit: c.limits[min(i*int(time.Second)/int(c.phase), len(c.limits)-1)], Event: "-"}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		st, err := mon.Status(ctx, key, 1)
		cancel()
		switch {
		case err != nil:
			readErrs++
			sec.Event = "unread"
		case st.Learned != nil:
			sec.Learned, sec.Found, sec.Event = st.Learned.Rate, st.Learned.Found, st.Learned.Event
		}
		time.Sleep(time.Until(end.Add(150 * time.Millisecond)))
		ok, ref := count(p, &mu, &reported, begin, i)
		sec.Accepted, sec.Refused = ok, ref
		series[i] = sec
		learned, found := "-", "-"
		if sec.Learned > 0 {
			learned = strconv.FormatFloat(sec.Learned, 'f', 1, 64)
		}
		if sec.Found > 0 {
			found = strconv.FormatFloat(sec.Found, 'f', 1, 64)
		}
		fmt.Fprintf(w, "%6d %6.0f %8s %-10s %8s %8d %8d\n", i, sec.Limit, learned, sec.Event, found, ok, ref)
	}
	wg.Wait()
	if err := errors.Join(procErrs...); err != nil {
		return Result{}, err
	}

	// The figures, from every answer (the live lines may have missed a
	// straggler).
	var all []arrival
	if p != nil {
		p.mu.Lock()
		all = p.arrivals
		p.mu.Unlock()
	} else {
		all = reported
	}
	for i := range series { // counted afresh
		series[i].Accepted, series[i].Refused = 0, 0
	}
	for _, a := range all {
		i := int(math.Floor(float64(a.at.Sub(begin)) / float64(time.Second)))
		if i < 0 || i >= secs {
			continue
		}
		res.Requests++
		if a.ok {
			series[i].Accepted++
		} else {
			series[i].Refused++
			res.Refused++
		}
	}
	res.Seconds = series
	res.PerProcess = perProc
	res.Errors = len(errs)
	if len(errs) > 0 {
		res.FirstError = errs[0]
	}
	if res.Requests > 0 {
		res.RefusedPct = 100 * float64(res.Refused) / float64(res.Requests)
	}
	res.Phases = phases(series, c.limits, int(c.phase/time.Second))

	fmt.Fprintf(w, "\nconverged: the first second of a phase (from 0) in which the partner accepted >= %.0f %% of the limit and refused nothing\n", 100*convergeShare)
	fmt.Fprintf(w, "%6s %6s %10s %12s %16s\n", "phase", "limit", "converged", "429s after", "accepted after")
	for i, ph := range res.Phases {
		if !ph.Converged {
			fmt.Fprintf(w, "%6d %6.0f %10s %12s %16s\n", i+1, ph.Limit, "never", "-", "-")
			continue
		}
		fmt.Fprintf(w, "%6d %6.0f %8d s %10.2f %% %12.1f %% of the limit\n", i+1, ph.Limit, ph.ConvergeSeconds, ph.RefusedPct, ph.ThroughputPct)
	}
	fmt.Fprintf(w, "goals after convergence: 429s < %.0f %% of the requests, accepted >= %.0f %% of the limit\n", goalRefused, goalThrough)
	fmt.Fprintf(w, "whole run: %d requests answered, %d refused (%.2f %%); sent per process %v\n", res.Requests, res.Refused, res.RefusedPct, res.PerProcess)
	for id, d := range late {
		fmt.Fprintf(w, "process %d started %s late\n", id, d)
	}
	if readErrs > 0 {
		fmt.Fprintf(w, "the learned rate could not be read in %d seconds\n", readErrs)
	}
	if res.Errors > 0 {
		fmt.Fprintf(w, "%d requests failed without an answer; the first: %s\n", res.Errors, res.FirstError)
	}
	return res, nil
}

// sleepUntil sleeps until t and reports true, or false as soon as stop
// is closed.
func sleepUntil(t time.Time, stop <-chan struct{}) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-stop:
		return false
	}
}

// count returns the requests accepted and refused in second i of the run
// so far: the partner's arrivals, or without a partner of its own the
// answers the processes reported. mu guards reported.
func count(p *partner, mu *sync.Mutex, reported *[]arrival, begin time.Time, i int) (ok, refused int) {
	var all []arrival
	if p != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		all = p.arrivals
	} else {
		mu.Lock()
		defer mu.Unlock()
		all = *reported
	}
	from, to := begin.Add(time.Duration(i)*time.Second), begin.Add(time.Duration(i+1)*time.Second)
	for j := len(all) - 1; j >= 0; j-- { // the newest are last (roughly)
		a := all[j]
		if a.at.Before(from.Add(-time.Second)) {
			break
		}
		if a.at.Before(from) || !a.at.Before(to) {
			continue
		}
		if a.ok {
			ok++
		} else {
			refused++
		}
	}
	return ok, refused
}

// phases computes each phase's figures from the series (see the package
// doc): per seconds long, one per limit.
func phases(series []Second, limits []float64, per int) []Phase {
	out := make([]Phase, len(limits))
	for ph, limit := range limits {
		out[ph] = Phase{Limit: limit, ConvergeSeconds: -1}
		from, to := ph*per, min((ph+1)*per, len(series))
		for i := from; i < to; i++ {
			if float64(series[i].Accepted) >= convergeShare*limit && series[i].Refused == 0 {
				out[ph].Converged, out[ph].ConvergeSeconds = true, i-from
				break
			}
		}
		if !out[ph].Converged {
			continue
		}
		ok, ref := 0, 0
		for i := from + out[ph].ConvergeSeconds; i < to; i++ {
			ok += series[i].Accepted
			ref += series[i].Refused
		}
		out[ph].Accepted, out[ph].Refused = ok, ref
		if ok+ref > 0 {
			out[ph].RefusedPct = 100 * float64(ref) / float64(ok+ref)
		}
		out[ph].ThroughputPct = 100 * float64(ok) / (limit * float64(to-from-out[ph].ConvergeSeconds))
	}
	return out
}

// forget deletes the run's keys (its learned record, its budget and
// clamp): an -redis given is left as it was found.
func forget(client *redis.Client, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := client.Scan(ctx, 0, "*"+key+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if len(keys) > 0 {
		_ = client.Del(ctx, keys...).Err()
	}
}
