// Command inflight-fleet shows an in-flight (concurrency) limit and a rate
// shared by a fleet of processes through Redis. A partner that refuses a
// call with 429 when n calls are already open at once is paced by
//
//	shaper.All(store, []shaper.Dimension{
//		{Name: "rate", Rate: shaper.PerSecond(rate)},
//		{Name: "open", InFlight: n, Lease: lease},
//	})
//
// The parent starts the partner on loopback (and a redis-server on a free
// port unless -redis or -cluster is given), then -procs copies of itself.
// Each copy runs -goroutines goroutines on one key, each looping Acquire,
// GET, read the body to its end, Release, until -duration ends, and reports
// its calls and departures (Reservation.Time) as a JSON line. The parent
// checks and prints:
//
//   - the partner's 429s (none) and the most calls it saw open at once (<= n);
//   - the rate: the departures of every process, sorted, replayed through
//     the contract's rule (GCRA, burst 1; see spread for the timing
//     allowed);
//   - the throughput from -warmup after the start, against
//     min(rate, n / call time): whichever binds;
//   - that no permit stays held once the processes have exited, but for
//     those that expire within a lease.
//
// With -kill k, a victim process first takes k of the n permits, calls the
// partner with each and is killed (SIGKILL) mid-call, holding them: its
// leases are no longer renewed, and the permits come back when they expire,
// between 4/5 of the lease and the lease after the kill (the leases are
// renewed every fifth of one), never before. The parent measures when the
// surviving processes first hold more than n - k permits.
//
//	go run ./examples/inflight-fleet
//	go run ./examples/inflight-fleet -inflight 10 -rate 1000 -call 200ms
//	go run ./examples/inflight-fleet -kill 10 -lease 2s -duration 5s
//	go run ./examples/inflight-fleet -cluster start
//	go run ./examples/inflight-fleet -json   # end with the figures as one JSON line
//
// Without -redis or -cluster it needs redis-server on PATH (and redis-cli
// for -cluster start; Debian: apt-get install redis-server).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/examples/internal/redisproc"
	"github.com/throttlekit/throttlekit-go/internal/conform"
	"github.com/throttlekit/throttlekit-go/internal/trace"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// workerEnv marks a child process: its value is the worker's number, or
// "victim" for the process of -kill.
const workerEnv = "THROTTLEKIT_INFLIGHT_WORKER"

// key is the one key every process shares.
const key = "partner"

// killAfter is how long after the run starts the victim is killed: the
// other processes are then all waiting for the permits it holds.
const killAfter = 250 * time.Millisecond

// recoveryTolerance is how much earlier than 4/5 of the lease after the
// kill a freed permit may be seen again. The kill's instant is read just
// before the signal, so the victim's last renewal ran at most a fifth of a
// lease before it and its leases expire from 4/5 of a lease after it, on
// Redis TIME (the same host clock): the tolerance covers a renewal the
// victim sent just before it died, and clock granularity.
const recoveryTolerance = 25 * time.Millisecond

type config struct {
	procs      int
	goroutines int
	inflight   int
	rate       int
	call       time.Duration // the partner's mean call time
	callSpread time.Duration // each call lasts call +- up to callSpread, uniformly
	duration   time.Duration
	lease      time.Duration
	redis      string // a node's address ("": start one, unless cluster)
	cluster    string // the cluster's addresses, comma-separated, or "start"
	kill       int    // permits the victim holds when it is killed (0: no victim)
	warmup     time.Duration

	name string // the shaper's name: one per run (set by the parent)
	url  string // the partner's (set by the parent)
}

// spread is the timing spread the rate replay allows each departure. A
// departure is read in the worker as Reservation.Time(): the slot Redis
// granted (on Redis TIME, which on one host is the processes' clock),
// converted to the process's clock as Delay from a reading taken after the
// reply, so it lags the slot by up to the time from the start of the
// reservation's call to that reading. Each worker bounds that lag for
// every departure, with the shaper's store-latency hook (which otelshaper
// uses too): the call started after the hook of the store call before it.
// The replay leaves out the departures whose lag may exceed spread, and
// replays the others with spread as its tolerance: they are a subset of
// the granted slots, which conform exactly, each shifted later by at most
// spread. Their lags are mostly 1-2 ms; on a loaded 2-core host a few
// percent reach tens of ms (scheduling), which would make a tolerance for
// all of them meaningless at 50/s (20 ms apart). (With
// redisstore.WithClientClock the store decides on the processes' clock
// and Reservation.Time is the slot itself: the replay then needs no
// spread at all.)
const spread = 5 * time.Millisecond

func main() {
	var c config
	flag.IntVar(&c.procs, "procs", 4, "processes sharing the key")
	flag.IntVar(&c.goroutines, "goroutines", 64, "goroutines per process, each calling in a loop")
	flag.IntVar(&c.inflight, "inflight", 10, "calls open at once that the partner accepts (n)")
	flag.IntVar(&c.rate, "rate", 50, "the shared rate, calls per second")
	flag.DurationVar(&c.call, "call", 100*time.Millisecond, "the partner's mean call time")
	flag.DurationVar(&c.callSpread, "call-spread", 0, "each call lasts -call +- up to this, uniformly")
	flag.DurationVar(&c.duration, "duration", 4*time.Second, "how long the processes call")
	flag.DurationVar(&c.lease, "lease", 2*time.Second, "how long a permit outlives a process killed holding it")
	flag.StringVar(&c.redis, "redis", "", "Redis address (default: start redis-server on a free port)")
	flag.StringVar(&c.cluster, "cluster", "", `Redis Cluster addresses, comma-separated, or "start" to start a 3-master cluster`)
	flag.IntVar(&c.kill, "kill", 0, "a victim process holds this many permits and is killed (SIGKILL) mid-call")
	flag.DurationVar(&c.warmup, "warmup", time.Second, "the start of the run left out of the throughput (as the processes start, they miss slots)")
	flag.StringVar(&c.name, "name", "", "the shaper's name (set by the parent for its workers)")
	flag.StringVar(&c.url, "url", "", "the partner's URL (set by the parent for its workers)")
	asJSON := flag.Bool("json", false, "end with the measurements as one JSON line")
	flag.Parse()

	var err error
	switch id := os.Getenv(workerEnv); id {
	case "":
		var res Result
		res, err = measure(os.Stdout, c)
		if *asJSON && res.Requests > 0 {
			_ = json.NewEncoder(os.Stdout).Encode(res)
		}
	case "victim":
		err = victim(c)
	default:
		err = worker(id, c)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inflight-fleet:", err)
		os.Exit(1)
	}
}

// client returns a client for the fleet's Redis: a cluster client when
// c.cluster lists addresses.
func (c config) client(pool int) redis.UniversalClient {
	if c.cluster != "" {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(c.cluster, ","), PoolSize: pool})
	}
	return redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: pool})
}

// fleetShaper is the shaper every process runs: a rate and an in-flight
// limit on the same key, on Redis.
func (c config) fleetShaper(client redis.UniversalClient) (*shaper.Shaper, *redisstore.Store, error) {
	// A call that cannot reach Redis within a second fails (FailClosed):
	// the default 250 ms is tighter than a loaded laptop running the whole
	// fleet needs.
	store := redisstore.New(client, redisstore.WithTimeout(time.Second))
	s, err := shaper.All(store, []shaper.Dimension{
		{Name: "rate", Rate: shaper.PerSecond(int64(c.rate))},
		{Name: "open", InFlight: int64(c.inflight), Lease: c.lease},
	}, shaper.WithName(c.name))
	if err != nil {
		_ = store.Close()
		return nil, nil, err
	}
	return s, store, nil
}

// message is a line a worker and the parent exchange as JSON: the worker
// says it is ready, the parent says when to start and stop, the worker
// reports.
type message struct {
	Ready bool  `json:"ready,omitempty"` // worker: its shaper is built
	Start int64 `json:"start,omitempty"` // parent: Unix ns
	End   int64 `json:"end,omitempty"`   // parent: Unix ns

	Worker   string `json:"worker,omitempty"`
	OK       int    `json:"ok,omitempty"`       // calls answered 200
	Rejected int    `json:"rejected,omitempty"` // answered 429
	Errors   int    `json:"errors,omitempty"`   // anything else: a failed Acquire, call or Release
	Error    string `json:"error,omitempty"`    // the first of them
	// Acquires refused because Redis did not answer in time (FailClosed)
	Unavailable int `json:"unavailable,omitempty"`
	// Per call sent: its departure (Reservation.Time, Unix ns), the most
	// it can lag its slot (ns; see spread), and when its response was read
	// to its end and closed, just before Release.
	Departures []int64 `json:"departures,omitempty"`
	Lags       []int64 `json:"lags,omitempty"`
	Ended      []int64 `json:"ended,omitempty"`
}

// worker is one process of the fleet: it says it is ready, reads when to
// start and stop from stdin, calls the partner from c.goroutines
// goroutines until then, and reports on stdout.
func worker(id string, c config) error {
	client := c.client(max(16, c.goroutines))
	defer client.Close()
	s, store, err := c.fleetShaper(client)
	if err != nil {
		return err
	}
	defer store.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = c.goroutines // keep the connections of the calls open at once
	httpClient := &http.Client{Transport: tr}
	defer httpClient.CloseIdleConnections()

	// Ready once Redis answered (a read of the key's standing): the run
	// does not start with the connections' dials.
	if _, err := s.Status(context.Background(), key, 1); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(message{Ready: true}); err != nil {
		return err
	}
	var run message
	if err := json.NewDecoder(os.Stdin).Decode(&run); err != nil {
		return fmt.Errorf("reading when to start: %w", err)
	}
	time.Sleep(time.Until(time.Unix(0, run.Start)))
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, run.End))
	defer cancel()

	rep := message{Worker: id}
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		rep.Errors++
		if rep.Error == "" {
			rep.Error = err.Error()
		}
	}
	var wg sync.WaitGroup
	for range c.goroutines {
		wg.Go(func() {
			// The store-latency hook runs on this goroutine after each
			// store call of Acquire: the reservation's call started
			// after the call before it ended (see spread).
			var last, reserveFrom time.Time
			ctx := trace.With(ctx, &trace.Hooks{StoreDone: func(_ context.Context, op string, _ time.Duration, _ error) {
				if op == "reserve" {
					reserveFrom = last
				}
				last = time.Now()
			}})
			for {
				last = time.Now()
				r, err := s.Acquire(ctx, key, 1)
				var late *shaper.DeadlineError
				switch {
				case err != nil && (ctx.Err() != nil || errors.As(err, &late)):
					return // the run is over (a slot past its end is refused)
				case errors.Is(err, shaper.ErrStoreUnavailable):
					// Redis did not answer within the store's timeout
					// (an overloaded host): the call is refused
					// (FailClosed); try again a little later.
					mu.Lock()
					rep.Unavailable++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
					continue
				case err != nil:
					fail(fmt.Errorf("acquire: %w", err))
					return
				}
				dep := r.Time()
				code, err := get(httpClient, c.url, id, c.call)
				ended := time.Now()
				if rerr := r.Release(context.Background()); rerr != nil {
					fail(fmt.Errorf("release: %w", rerr))
				}
				mu.Lock()
				rep.Departures = append(rep.Departures, dep.UnixNano())
				// r.Time() is Delay from a clock reading taken after the
				// reservation's reply: that reading minus the start of
				// the call bounds the lag of the departure behind its slot.
				rep.Lags = append(rep.Lags, int64(dep.Add(-r.Delay).Sub(reserveFrom)))
				rep.Ended = append(rep.Ended, ended.UnixNano())
				switch {
				case err != nil:
					mu.Unlock()
					fail(err)
					continue
				case code == http.StatusOK:
					rep.OK++
				case code == http.StatusTooManyRequests:
					rep.Rejected++
				default:
					mu.Unlock()
					fail(fmt.Errorf("the partner answered %d", code))
					continue
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out.Encode(rep)
}

// get calls the partner once, reads the body to its end and closes it.
// The call is not bound to the run's end: a call sent finishes.
func get(c *http.Client, url, worker string, call time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*call+5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Worker", worker)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, err
}

// victim takes c.kill permits and calls the partner with each; the partner
// holds those calls until the caller goes away. It never returns: the
// parent kills it.
func victim(c config) error {
	client := c.client(max(16, c.kill))
	defer client.Close()
	s, store, err := c.fleetShaper(client)
	if err != nil {
		return err
	}
	defer store.Close()
	httpClient := &http.Client{}
	errs := make(chan error, c.kill)
	for range c.kill {
		go func() {
			r, err := s.Acquire(context.Background(), key, 1)
			if err != nil {
				errs <- err
				return
			}
			defer r.Release(context.Background())
			_, err = get(httpClient, c.url, "victim", time.Hour)
			errs <- fmt.Errorf("the partner answered the victim: %v", err)
		}()
	}
	return <-errs
}

// partner refuses a call with 429 when limit calls are already open, and
// holds the others for its call time. A victim's call is held until its
// caller goes away.
type partner struct {
	limit      int
	call       time.Duration
	callSpread time.Duration

	mu         sync.Mutex
	open       int
	maxOpen    int
	rejected   int
	victimOpen int
	arrivals   []time.Time
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	isVictim := r.Header.Get("X-Worker") == "victim"
	p.mu.Lock()
	if p.open >= p.limit {
		p.rejected++
		p.mu.Unlock()
		http.Error(w, "concurrency", http.StatusTooManyRequests)
		return
	}
	p.open++
	p.maxOpen = max(p.maxOpen, p.open)
	p.arrivals = append(p.arrivals, now)
	if isVictim {
		p.victimOpen++
	}
	p.mu.Unlock()

	d := p.call
	if p.callSpread > 0 {
		d += time.Duration(rand.Int64N(int64(2*p.callSpread)+1)) - p.callSpread
	}
	if isVictim {
		d = time.Hour
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-r.Context().Done(): // the caller went away (killed)
	}
	t.Stop()
	// Closed before the answer is written: the caller releases its permit
	// after reading the answer, so the next call it lets through finds
	// this one closed.
	p.mu.Lock()
	p.open--
	if isVictim {
		p.victimOpen--
	}
	p.mu.Unlock()
	_, _ = io.WriteString(w, "ok")
}

func (p *partner) victimCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.victimOpen
}

// Result is what the parent measured.
type Result struct {
	Requests   int // calls answered 200, all processes
	Departures int // calls sent
	Rejected   int // calls answered 429: the partner saw more than n open
	Errors     int // failed Acquire, call or Release
	// Unavailable counts the Acquires refused because Redis did not
	// answer within the store's timeout (1 s): on an overloaded host.
	// They are retried 50 ms later; they cost throughput, nothing else.
	Unavailable int
	MaxOpen     int     // the most calls the partner saw open at once
	PerProcess  []int   // calls sent, per process
	Throughput  float64 // departures per second, from warmup after the start to the end (see ramp)
	Expected    float64 // min(rate, n / call time)
	// Replayed is how many departures the rate replay kept: those whose
	// lag is bounded by spread. Needed is the least timing
	// spread with which they replay through the rate's GCRA (burst 1): how
	// much closer than the interval the closest two came. The replay
	// passes when Needed <= spread.
	Replayed int
	Needed   time.Duration
	// With -kill: from the kill until the survivors first held more than
	// n - k permits, i.e. one of the victim's permits came back.
	Recovery time.Duration
	// HeldAfter is how many permits the key held fleet-wide once every
	// process had exited (Shaper.Status), HeldFor how long until none was
	// held, and HeldLeft how many still were after a lease (must be 0). A
	// take cut short by its caller's ctx gives its lease back, so none is
	// expected; one a process took as it exited, before it could give it
	// back, is held by nobody, never renewed, and expires within a lease.
	HeldAfter, HeldLeft int64
	HeldFor             time.Duration
}

// proc is a worker process the parent runs.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *json.Decoder
	stderr strings.Builder
}

func (c config) start(self, id string) (*proc, error) {
	p := &proc{cmd: exec.Command(self, c.args()...)}
	p.cmd.Env = append(os.Environ(), workerEnv+"="+id)
	p.cmd.Stderr = &p.stderr
	in, err := p.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.stdin, p.stdout = in, json.NewDecoder(out)
	return p, p.cmd.Start()
}

// args are the flags of a worker: the parent's config, resolved.
func (c config) args() []string {
	return []string{
		"-goroutines", strconv.Itoa(c.goroutines), "-inflight", strconv.Itoa(c.inflight),
		"-rate", strconv.Itoa(c.rate), "-call", c.call.String(), "-lease", c.lease.String(),
		"-redis", c.redis, "-cluster", c.cluster, "-kill", strconv.Itoa(c.kill),
		"-name", c.name, "-url", c.url,
	}
}

// measure runs the fleet and returns what it measured. It fails if a
// process fails, the partner answered 429 or saw more than n calls open,
// the departures do not replay through the rate, or a killed process's
// permits came back too early or too late.
func measure(w io.Writer, c config) (Result, error) {
	switch {
	case c.procs < 1 || c.goroutines < 1 || c.inflight < 1 || c.rate < 1 || c.call <= 0 || c.duration <= 0:
		return Result{}, errors.New("need -procs, -goroutines, -inflight, -rate >= 1 and -call, -duration > 0")
	case c.callSpread < 0 || c.callSpread >= c.call:
		return Result{}, errors.New("need 0 <= -call-spread < -call")
	case c.kill < 0 || c.kill > c.inflight:
		return Result{}, errors.New("need 0 <= -kill <= -inflight")
	case c.kill > 0 && c.duration < killAfter+c.lease+time.Second:
		return Result{}, fmt.Errorf("with -kill, -duration must be at least %v (the kill, the lease, 1 s)", killAfter+c.lease+time.Second)
	case c.warmup < 0 || c.duration-c.warmup < 2*ramp:
		return Result{}, fmt.Errorf("need -warmup >= 0 and -duration at least %v longer", 2*ramp)
	}
	switch {
	case c.cluster == "start":
		addrs, stop, err := redisproc.StartCluster()
		if err != nil {
			return Result{}, err
		}
		defer stop()
		c.cluster = strings.Join(addrs, ",")
	case c.cluster == "" && c.redis == "":
		addr, stop, err := redisproc.Start(false)
		if err != nil {
			return Result{}, err
		}
		defer stop()
		c.redis = addr
	}
	// A name of its own: what an earlier run left on this Redis (the
	// leases of a process it killed, say) does not count in this one.
	c.name = "inflight-demo-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	client := c.client(4)
	defer client.Close()
	where := c.redis
	if c.cluster != "" {
		where = "the cluster " + c.cluster
	}
	if err := client.Ping(context.Background()).Err(); err != nil {
		return Result{}, fmt.Errorf("redis at %s: %w", where, err)
	}

	p := &partner{limit: c.inflight, call: c.call, callSpread: c.callSpread}
	srv := httptest.NewServer(p)
	defer srv.Close()
	c.url = srv.URL
	self, err := os.Executable()
	if err != nil {
		return Result{}, err
	}
	fmt.Fprintf(w, "%d processes x %d goroutines share %d/s and %d in flight (lease %v) through Redis at %s; calls take %v\n",
		c.procs, c.goroutines, c.rate, c.inflight, c.lease, where, c.call)

	var v *proc // the victim
	if c.kill > 0 {
		if v, err = c.start(self, "victim"); err != nil {
			return Result{}, err
		}
		defer func() {
			if v.cmd.ProcessState == nil {
				_ = v.cmd.Process.Kill()
				_ = v.cmd.Wait()
			}
		}()
		for deadline := time.Now().Add(10 * time.Second); p.victimCalls() < c.kill; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				_ = v.cmd.Process.Kill()
				_ = v.cmd.Wait() // before reading its stderr
				return Result{}, fmt.Errorf("the victim did not hold %d calls open within 10 s: %s", c.kill, v.stderr.String())
			}
		}
		fmt.Fprintf(w, "a victim process holds %d permits, each in a call\n", c.kill)
	}

	procs := make([]*proc, c.procs)
	defer func() {
		for _, pr := range procs {
			if pr != nil && pr.cmd.Process != nil && pr.cmd.ProcessState == nil {
				_ = pr.cmd.Process.Kill()
				_ = pr.cmd.Wait()
			}
		}
	}()
	for i := range procs {
		if procs[i], err = c.start(self, strconv.Itoa(i+1)); err != nil {
			return Result{}, err
		}
	}
	for i, pr := range procs {
		var m message
		if err := pr.stdout.Decode(&m); err != nil || !m.Ready {
			_ = pr.cmd.Wait()
			return Result{}, fmt.Errorf("process %d did not start: %v: %s", i+1, err, pr.stderr.String())
		}
	}
	// One start for all, whenever each process came up.
	start := time.Now().Add(50 * time.Millisecond)
	end := start.Add(c.duration)
	for _, pr := range procs {
		if err := json.NewEncoder(pr.stdin).Encode(message{Start: start.UnixNano(), End: end.UnixNano()}); err != nil {
			return Result{}, err
		}
	}
	var killed time.Time
	if v != nil {
		time.Sleep(time.Until(start.Add(killAfter)))
		killed = time.Now() // the victim dies after this reading: its last renewal was at most lease/3 before it
		if err := v.cmd.Process.Kill(); err != nil {
			return Result{}, err
		}
		_ = v.cmd.Wait()
		fmt.Fprintf(w, "killed it %v after the start, holding them\n", killAfter)
	}

	reps := make([]message, c.procs)
	var errs []error
	for i, pr := range procs {
		err := pr.stdout.Decode(&reps[i])
		if werr := pr.cmd.Wait(); werr != nil || err != nil {
			errs = append(errs, fmt.Errorf("process %d: %v %v: %s", i+1, err, werr, pr.stderr.String()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	res, deps := c.collect(reps, start, end)

	// Every permit given back: released, or (the victim's) expired. The
	// run's end cuts short the takes of the requests waiting then; each
	// gives its lease back, unless its process exited first (a crash, as
	// far as Redis knows): that lease expires within the lease time, so
	// the parent reads until none is held.
	s, st, err := c.fleetShaper(client)
	if err != nil {
		return res, err
	}
	defer st.Close()
	ended := time.Now()
	for first := true; ; first = false {
		held, err := inFlight(s)
		if err != nil {
			return res, err
		}
		if first {
			res.HeldAfter = held
		}
		if held == 0 || time.Since(ended) > c.lease+time.Second {
			res.HeldLeft = held
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.HeldFor = time.Since(ended)
	p.mu.Lock()
	res.MaxOpen, res.Rejected = p.maxOpen, p.rejected
	arrivals := len(p.arrivals)
	p.mu.Unlock()

	res.Needed = needed(deps, c.rate)
	rep := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	rep("")
	rep("%8s %8s", "process", "calls")
	for i, n := range res.PerProcess {
		rep("%8d %8d", i+1, n)
	}
	rep("%8s %8d (the partner saw %d arrivals)", "all", res.Departures, arrivals)
	rep("429s for concurrency: %d", res.Rejected)
	if res.Unavailable > 0 {
		rep("Acquires refused because Redis did not answer within 1 s (an overloaded host): %d", res.Unavailable)
	}
	rep("most calls open at once: %d (limit %d)", res.MaxOpen, c.inflight)
	rep("rate replay: %d of %d departures (those that may lag their slot by %v at most) through GCRA %d/s burst 1: the closest came %v early (allowed %v)",
		res.Replayed, res.Departures, spread, c.rate, res.Needed.Round(time.Microsecond), spread)
	binds := "the rate binds"
	if float64(c.inflight)/c.call.Seconds() < float64(c.rate) {
		binds = "the in-flight limit binds"
	}
	rep("throughput: %.1f/s from %v after the start, %.1f%% of min(%d/s, %d / %v) = %.1f/s (%s)",
		res.Throughput, c.warmup, 100*res.Throughput/res.Expected, c.rate, c.inflight, c.call, res.Expected, binds)
	if v != nil {
		res.Recovery = recovery(reps, killed, c.inflight-c.kill)
		rep("the victim's permits came back %v after the kill (lease %v: expected from %v to %v)", res.Recovery, c.lease, c.lease*4/5, c.lease)
	}
	if res.HeldAfter > 0 {
		rep("permits held once the processes had exited: %d (taken as a process exited; unrenewed, they expire), none %v later",
			res.HeldAfter, res.HeldFor.Round(time.Millisecond))
	} else {
		rep("permits held once the processes had exited: none")
	}

	switch {
	case res.Errors > 0:
		return res, fmt.Errorf("%d calls failed; the first: %s", res.Errors, firstError(reps))
	case res.Rejected > 0:
		return res, fmt.Errorf("the partner answered %d calls 429: more than %d open at once", res.Rejected, c.inflight)
	case res.MaxOpen > c.inflight:
		return res, fmt.Errorf("the partner saw %d calls open at once, limit %d", res.MaxOpen, c.inflight)
	case res.Replayed < 2:
		return res, fmt.Errorf("only %d departures to replay", res.Replayed)
	case res.HeldLeft != 0:
		return res, fmt.Errorf("%d permits still held a lease after the run", res.HeldLeft)
	}
	interval := 1000 / float64(c.rate) // ms
	// conform.Check's tolerance is the bucket's depth: burst 1 is one
	// interval, plus the spread allowed.
	if d, ok := conform.Check(interval, interval+ms(spread), deps); !ok {
		return res, fmt.Errorf("the departure at %.3f ms after the start does not conform to %d/s (burst 1, spread %v)", d.At, c.rate, spread)
	}
	if v != nil {
		switch {
		case res.Recovery < 0:
			return res, errors.New("the victim's permits never came back")
		case res.Recovery < c.lease*4/5-recoveryTolerance:
			return res, fmt.Errorf("a permit of the killed victim came back %v after the kill, before its lease (%v) could have expired", res.Recovery, c.lease)
		case res.Recovery > c.lease+time.Second:
			return res, fmt.Errorf("the killed victim's permits came back only %v after the kill (lease %v)", res.Recovery, c.lease)
		}
	}
	return res, nil
}

// inFlight returns the permits held on the key, fleet-wide.
func inFlight(s *shaper.Shaper) (int64, error) {
	status, err := s.Status(context.Background(), key, 1)
	if err != nil {
		return 0, err
	}
	for _, d := range status.Dimensions {
		if d.Name == "open" {
			return d.InFlight, nil
		}
	}
	return 0, errors.New("no in-flight dimension in the status")
}

// ramp is how far from each edge of the throughput's window a departure
// counts in full: one nearer counts in part, in proportion (a trapezoid
// window). The permits of a fleet whose in-flight limit binds cycle in
// step (they were all taken at the start, and each cycle lasts about the
// call time), so departures come in bursts of n; a sharp window would
// count a burst at its edge in or out whole, +-n over the window (with n
// 10 and 200 ms calls, +-3 % over 3 s). Ramps of half a second, longer
// than a cycle, average that out: a steady rate is measured exactly.
const ramp = 500 * time.Millisecond

// collect sums the reports and returns the departures of every process,
// in ms after start, for the replay.
func (c config) collect(reps []message, start, end time.Time) (Result, []conform.Departure) {
	res := Result{PerProcess: make([]int, len(reps))}
	var deps []conform.Departure
	from := start.Add(c.warmup)
	weight := 0.0 // the departures in the window, those near its edges in part
	for i, r := range reps {
		res.Requests += r.OK
		res.Errors += r.Errors
		res.Unavailable += r.Unavailable
		res.PerProcess[i] = len(r.Departures)
		res.Departures += len(r.Departures)
		for k, d := range r.Departures {
			t := time.Unix(0, d)
			if time.Duration(r.Lags[k]) <= spread {
				deps = append(deps, conform.Departure{At: ms(t.Sub(start)), Cost: 1})
			}
			weight += max(0, min(1, min(t.Sub(from), end.Sub(t)).Seconds()/ramp.Seconds()))
		}
	}
	res.Replayed = len(deps)
	res.Throughput = weight / (end.Sub(from) - ramp).Seconds()
	res.Expected = min(float64(c.rate), float64(c.inflight)/c.call.Seconds())
	return res, deps
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// needed returns the least timing spread eps with which deps replay
// through GCRA at rate, burst 1: each departure at or after the previous
// theoretical arrival time minus eps. In the virtual-scheduling form the
// theoretical arrival time does not depend on eps, so it is the most any
// departure came before it.
func needed(deps []conform.Departure, rate int) time.Duration {
	at := make([]float64, len(deps))
	for i, d := range deps {
		at[i] = d.At
	}
	slices.Sort(at)
	interval := 1000 / float64(rate)
	tat, worst := math.Inf(-1), 0.0
	for _, t := range at {
		worst = max(worst, tat-t)
		tat = max(tat, t) + interval
	}
	return time.Duration(worst * float64(time.Millisecond))
}

// recovery returns how long after killed the survivors first held more
// than free permits (the ones the victim left them), or -1. A call holds
// its permit from its departure (after the grant) to the end of its
// response (before the release): shorter than the permit was held, so
// the figure is never early.
func recovery(reps []message, killed time.Time, free int) time.Duration {
	type event struct {
		at    int64
		delta int
	}
	var evs []event
	for _, r := range reps {
		for i, d := range r.Departures {
			evs = append(evs, event{d, +1}, event{r.Ended[i], -1})
		}
	}
	slices.SortFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(max(-1, min(1, a.at-b.at)))
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	open := 0
	for _, e := range evs {
		open += e.delta
		if e.delta > 0 && open > free && e.at > killed.UnixNano() {
			return time.Unix(0, e.at).Sub(killed)
		}
	}
	return -1
}

func firstError(reps []message) string {
	for _, r := range reps {
		if r.Error != "" {
			return r.Error
		}
	}
	return ""
}
