// Command redis-fleet shows several OS processes sharing one budget through
// Redis. The parent starts an arrival-recording partner on loopback (and a
// redis-server on a free port unless -redis is given), then starts -procs
// copies of itself. Each copy paces its requests with a shaper on a
// redisstore.Store and sends them from -goroutines goroutines (8 by default) as
// fast as its slots allow. The parent prints what the partner saw:
// per-process and aggregate rates, the most arrivals in any 1 s window, and
// how many scripts ran on Redis: with many goroutines, each process's
// redisstore.Store sends the reservations made while a call is in flight together
// in its next call (redisstore.WithCoalescing).
//
// With -change N, the parent changes the fleet's contract to N/s while it
// runs (Shaper.SetRate from a shaper of its own, after -change-at): every
// process follows within its refresh interval (1 s), and the parent
// measures the busiest second before the change and after the fleet has
// followed.
//
// With -clamp N, the partner answers one request, after -clamp-at, with
// RateLimit-Remaining: N and RateLimit-Reset: -clamp-reset: the process
// that reads it clamps the shared key (Shaper.Clamp, through the
// transport), and every process spreads the N calls left over the reset.
//
//	go run ./examples/redis-fleet [-procs 4] [-rate 500] [-goroutines 8] [-duration 5s] [-redis host:port] [-short]
//	go run ./examples/redis-fleet -rate 20000 -goroutines 64
//	go run ./examples/redis-fleet -rate 500 -change 200 -change-at 2s -duration 5s
//	go run ./examples/redis-fleet -rate 500 -clamp 20 -clamp-reset 2s -clamp-at 1s -duration 4s
//
// Without -redis it needs redis-server on PATH (Debian: apt-get install
// redis-server).
package main

import (
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/examples/internal/redisproc"
	"github.com/throttlekit/throttlekit-go/examples/internal/window"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
	"github.com/throttlekit/throttlekit-go/transport"
)

// workerEnv marks a child process; its value is the worker's number.
const workerEnv = "THROTTLEKIT_FLEET_WORKER"

type config struct {
	procs    int
	rate     int
	duration time.Duration
	redis    string
	change   int           // a new rate, set live (0: none)
	changeAt time.Duration // when, after the processes start

	goroutines int           // per process, each sending as fast as its slots allow
	spread     time.Duration // the departures' wake-up lateness allowed at least (jitterAllowance; at least 10 ms)

	clamp      int           // calls left that the partner reports once (0: never)
	clampReset time.Duration // until its reset
	clampAt    time.Duration // when, after the processes start
}

// settle is how long after a live change every process runs the new
// contract: the refresh interval, and the slots granted before the change
// that the processes' 8 goroutines each still hold.
const settle = shaper.DefaultContractRefresh + 200*time.Millisecond

func main() {
	var c config
	short := flag.Bool("short", false, "2 processes for 2 s (CI)")
	flag.IntVar(&c.procs, "procs", 4, "processes sharing the budget")
	flag.IntVar(&c.rate, "rate", 500, "the shared contract, requests per second")
	flag.IntVar(&c.goroutines, "goroutines", 8, "goroutines per process sending requests")
	flag.DurationVar(&c.duration, "duration", 5*time.Second, "how long each process sends")
	flag.StringVar(&c.redis, "redis", "", "Redis address (default: start redis-server on a free port)")
	url := flag.String("url", "", "the partner's URL (set by the parent for its workers)")
	asJSON := flag.Bool("json", false, "end with the measurements as one JSON line (for make bench)")
	flag.IntVar(&c.change, "change", 0, "change the contract live to this many requests per second")
	flag.DurationVar(&c.changeAt, "change-at", 2*time.Second, "when to change it, after the processes start")
	flag.IntVar(&c.clamp, "clamp", 0, "the partner reports this many calls left once")
	flag.DurationVar(&c.clampReset, "clamp-reset", 2*time.Second, "until its reset")
	flag.DurationVar(&c.clampAt, "clamp-at", time.Second, "when, after the processes start")
	flag.Parse()
	if *short {
		c.procs, c.duration = 2, 2*time.Second
	}
	var err error
	if id := os.Getenv(workerEnv); id != "" {
		err = worker(id, c, *url)
	} else {
		var res Result
		res, err = measure(os.Stdout, c)
		if *asJSON && res.Arrivals > 0 {
			_ = json.NewEncoder(os.Stdout).Encode(res)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "redis-fleet:", err)
		os.Exit(1)
	}
}

// fleetShaper is the shaper every process of the fleet runs, and the one
// the parent changes the contract with: the same name and configured rate,
// so that they follow the same live contract.
func fleetShaper(client redis.UniversalClient, rate int) (*shaper.Shaper, *redisstore.Store, error) {
	// A call that cannot reach Redis within a second fails (the default
	// policy is FailClosed); the default 250 ms is tighter than a loaded
	// laptop running the whole fleet needs.
	store := redisstore.New(client, redisstore.WithTimeout(time.Second))
	s, err := shaper.New(store, shaper.PerSecond(int64(rate)), shaper.WithName("fleet-demo"))
	if err != nil {
		_ = store.Close()
		return nil, nil, err
	}
	return s, store, nil
}

// worker is one process of the fleet: it sends requests to url from 8
// goroutines, each paced by the shared Redis budget, for c.duration.
func worker(id string, c config, url string) error {
	client := redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: max(16, c.goroutines)})
	defer client.Close()
	s, store, err := fleetShaper(client, c.rate)
	if err != nil {
		return err
	}
	defer store.Close()
	tr := transport.New(slotted{s}, transport.WithKey(func(*http.Request) string { return "partner" }),
		transport.WithBase(stamp{http.DefaultTransport}))
	httpClient := &http.Client{Transport: tr}
	defer httpClient.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, c.goroutines)
	for range c.goroutines {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(context.WithValue(ctx, slotKey{}, new(slotBox)), http.MethodGet, url, nil)
				req.Header.Set("X-Worker", id)
				resp, err := httpClient.Do(req)
				if err != nil {
					if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
						return // the run is over; a slot past its end was given back
					}
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// slotKey is the context key of a request's slotBox: the measurement's
// own, so that stamp can tell how late each request left its slot.
type slotKey struct{}

type slotBox struct{ slot time.Time }

// slotted is the fleet's shaper with every method (so the transport finds
// the same capabilities), whose Acquire also notes the slot it granted in
// the request's slotBox.
type slotted struct{ *shaper.Shaper }

func (s slotted) Acquire(ctx context.Context, key string, cost int64) (shaper.Reservation, error) {
	res, err := s.Shaper.Acquire(ctx, key, cost)
	if b, ok := ctx.Value(slotKey{}).(*slotBox); ok && err == nil {
		b.slot = res.Time()
	}
	return res, err
}

// stamp records the departure instant (after the slot's wait) in a header,
// so that the partner can tell the fleet's pacing from loopback jitter,
// and how late the request left its slot.
type stamp struct{ base http.RoundTripper }

func (s stamp) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	req = req.Clone(req.Context()) // a RoundTripper must not modify the caller's request
	req.Header.Set("X-Departed", strconv.FormatInt(now.UnixNano(), 10))
	if b, ok := req.Context().Value(slotKey{}).(*slotBox); ok && !b.slot.IsZero() {
		req.Header.Set("X-Late", strconv.FormatInt(int64(now.Sub(b.slot)), 10))
	}
	return s.base.RoundTrip(req)
}

// partner records each arrival's time, departure time and worker; with
// clampAfter set, it reports clamp calls left until clampReset on the first
// response after that instant.
type partner struct {
	mu         sync.Mutex
	arrivals   []time.Time
	departures []time.Time
	late       []time.Duration // each departure after its slot, as its process saw it
	workers    []int

	clamp      int
	clampReset time.Duration
	clampAfter time.Time
	clampedAt  time.Time // when it reported them (zero: not yet)
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	id, _ := strconv.Atoi(r.Header.Get("X-Worker"))
	dep, _ := strconv.ParseInt(r.Header.Get("X-Departed"), 10, 64)
	late, _ := strconv.ParseInt(r.Header.Get("X-Late"), 10, 64)
	p.mu.Lock()
	p.arrivals = append(p.arrivals, now)
	p.departures = append(p.departures, time.Unix(0, dep))
	p.late = append(p.late, time.Duration(late))
	p.workers = append(p.workers, id)
	if p.clamp > 0 && p.clampedAt.IsZero() && !p.clampAfter.IsZero() && now.After(p.clampAfter) {
		p.clampedAt = now
		w.Header().Set("RateLimit-Remaining", strconv.Itoa(p.clamp))
		w.Header().Set("RateLimit-Reset", strconv.FormatFloat(p.clampReset.Seconds(), 'f', -1, 64))
	}
	p.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// Result is what the parent measured.
type Result struct {
	Arrivals  int
	Rate      float64 // aggregate arrivals per second, first to last arrival
	ErrorPct  float64 // (Rate - contract) / contract, in percent
	MostIn1s  int     // the most departures in any 1 s window: the fleet's pacing
	MostArr1s int     // the most arrivals in any 1 s window: pacing plus loopback jitter
	// MaxLate is the latest any request left after its slot: the wake-up
	// lateness of the process that held it. A 1 s window of departures
	// holds the slots of 1 s plus MaxLate, so the allowance over the
	// contract is its rate times MaxLate (at least times config.spread).
	MaxLate   time.Duration
	PerWorker []int
	// With a live change: the busiest 1 s of departures before it, and
	// from settle after it to the end, and the aggregate rate then.
	MostBefore, MostAfter int
	RateAfter             float64
	// MostAcross is the busiest 1 s of departures over the whole run,
	// across the change while the fleet follows it: within the more
	// generous of the two contracts.
	MostAcross int
	// ScriptCalls is how many scripts the fleet ran on Redis (INFO
	// commandstats, EVALSHA and EVAL; 0 if unreadable): under load the
	// store sends many reservations per call (redisstore.WithCoalescing).
	ScriptCalls int64
	// With a clamp: the departures from clampLead after the partner
	// reported its calls left to its reset, in all and per process.
	Clamped           int
	ClampedPerProcess []int
}

// clampLead is how long after the partner reports its calls left the
// clamp is measured from: the slots the processes' 8 goroutines each
// already held keep their times.
const clampLead = 150 * time.Millisecond

// measure runs the fleet and returns what the partner saw. It fails if any
// process fails or the contract is exceeded in some second.
func measure(w io.Writer, c config) (Result, error) {
	if c.goroutines == 0 {
		c.goroutines = 8
	}
	if c.procs < 1 || c.rate < 1 || c.duration <= 0 || c.goroutines < 1 {
		return Result{}, fmt.Errorf("need -procs >= 1, -rate >= 1, -duration > 0, -goroutines >= 1")
	}
	if c.redis == "" {
		addr, stop, err := redisproc.Start(false)
		if err != nil {
			return Result{}, err
		}
		defer stop()
		c.redis = addr
	}
	// A fresh budget and contract: an earlier run's keys would delay this one.
	client := redis.NewClient(&redis.Options{Addr: c.redis})
	defer client.Close()
	err := client.Del(context.Background(), "tk:fleet-demo:{partner}", "tk:fleet-demo:{partner}:p", "tk:fleet-demo:contract").Err()
	if err != nil {
		return Result{}, fmt.Errorf("redis at %s: %w", c.redis, err)
	}
	statsReset := client.ConfigResetStat(context.Background()).Err() == nil

	p := &partner{clamp: c.clamp, clampReset: c.clampReset}
	if c.clamp > 0 {
		p.clampAfter = time.Now().Add(c.clampAt)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	self, err := os.Executable()
	if err != nil {
		return Result{}, err
	}
	fmt.Fprintf(w, "%d processes share %d requests/s through Redis at %s for %v each\n", c.procs, c.rate, c.redis, c.duration)
	var wg sync.WaitGroup
	errs := make([]error, c.procs+1)
	var changed time.Time
	if c.change > 0 {
		fmt.Fprintf(w, "the contract changes to %d/s %v after they start\n", c.change, c.changeAt)
		wg.Go(func() {
			time.Sleep(c.changeAt)
			s, store, err := fleetShaper(client, c.rate)
			if err == nil {
				defer store.Close()
				err = s.SetRate(context.Background(), "", shaper.PerSecond(int64(c.change)))
			}
			changed = time.Now()
			if err != nil {
				errs[c.procs] = fmt.Errorf("the live change: %w", err)
			}
		})
	}
	for i := range c.procs {
		cmd := exec.Command(self, "-procs", "1", "-rate", strconv.Itoa(c.rate), "-goroutines", strconv.Itoa(c.goroutines), "-duration", c.duration.String(), "-redis", c.redis, "-url", srv.URL)
		cmd.Env = append(os.Environ(), workerEnv+"="+strconv.Itoa(i+1))
		wg.Go(func() {
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("process %d: %v: %s", i+1, err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	res := Result{Arrivals: len(p.arrivals), PerWorker: make([]int, c.procs)}
	if res.Arrivals < 2 {
		return res, fmt.Errorf("the partner saw %d arrivals", res.Arrivals)
	}
	for _, id := range p.workers {
		if id >= 1 && id <= c.procs {
			res.PerWorker[id-1]++
		}
	}
	ts := sorted(p.departures)
	span := ts[len(ts)-1].Sub(ts[0])
	res.Rate = float64(len(ts)-1) / span.Seconds()
	res.ErrorPct = (res.Rate - float64(c.rate)) / float64(c.rate) * 100
	res.MostIn1s = window.MostInOneSecond(ts)
	res.MostArr1s = window.MostInOneSecond(sorted(p.arrivals))
	res.MaxLate = slices.Max(p.late)
	c.spread = max(c.spread, res.MaxLate)
	if statsReset {
		res.ScriptCalls = scriptCalls(client)
	}
	fmt.Fprintf(w, "\n%8s %9s %9s\n", "process", "arrivals", "per s")
	for i, n := range res.PerWorker {
		fmt.Fprintf(w, "%8d %9d %9.1f\n", i+1, n, float64(n)/span.Seconds())
	}
	fmt.Fprintf(w, "%8s %9d %9.1f\n", "all", res.Arrivals, res.Rate)
	fmt.Fprintf(w, "\naggregate %.1f/s against a contract of %d/s (%+.2f%%)\n", res.Rate, c.rate, res.ErrorPct)
	fmt.Fprintf(w, "most in any 1 s window: %d departures (limit %d + burst 1), %d arrivals (departures plus loopback jitter)\n",
		res.MostIn1s, c.rate, res.MostArr1s)
	fmt.Fprintf(w, "the latest departure left %v after its slot: a 1 s window may hold %d more than the contract\n",
		res.MaxLate.Round(10*time.Microsecond), jitterAllowance(c.rate, c.spread))
	if res.ScriptCalls > 0 {
		fmt.Fprintf(w, "%d scripts ran on Redis: %.2f requests per script\n", res.ScriptCalls, float64(res.Arrivals)/float64(res.ScriptCalls))
	}
	if c.change > 0 {
		return res, c.checkChange(w, &res, ts, changed)
	}
	if c.clamp > 0 {
		return res, c.checkClamp(w, &res, p)
	}
	// The slots never exceed the contract; a departure is its slot plus the
	// wake-up lateness of the process that holds it, and on a loaded host that
	// varies by a few ms (more under -race), so a window that opens at a late
	// departure can hold rate x the latest lateness more (c.spread, at least
	// 10 ms). docs/SHAPER.md ("Slots and departures") has the figures; a
	// partner that counts strictly wants a rate a percent below its limit. An
	// excess above that allowance is a failure.
	if allowed := c.rate + 1 + jitterAllowance(c.rate, c.spread); res.MostIn1s > allowed {
		return res, fmt.Errorf("the contract was exceeded: %d departures in one second (allowed %d)", res.MostIn1s, allowed)
	}
	return res, nil
}

// checkChange measures a live change: before it every second holds the
// old contract, and from settle after it the new one (+ burst 1 + the
// jitter allowance, as in measure).
func (c config) checkChange(w io.Writer, res *Result, ts []time.Time, changed time.Time) error {
	from := changed.Add(settle)
	i := 0
	for i < len(ts) && ts[i].Before(changed) {
		i++
	}
	j := i
	for j < len(ts) && ts[j].Before(from) {
		j++
	}
	after := ts[j:]
	res.MostBefore, res.MostAfter = window.MostInOneSecond(ts[:i]), window.MostInOneSecond(after)
	if len(after) < 2 || after[len(after)-1].Sub(after[0]) < time.Second {
		return fmt.Errorf("less than a second of departures after the fleet followed the change: lengthen -duration")
	}
	res.RateAfter = float64(len(after)-1) / after[len(after)-1].Sub(after[0]).Seconds()
	res.MostAcross = window.MostInOneSecond(ts)
	generous := max(c.rate, c.change)
	fmt.Fprintf(w, "before the change: most in 1 s %d (limit %d + 1)\n", res.MostBefore, c.rate)
	fmt.Fprintf(w, "from %v after it: most in 1 s %d (limit %d + 1), aggregate %.1f/s\n", settle, res.MostAfter, c.change, res.RateAfter)
	fmt.Fprintf(w, "across the change, while the fleet follows it: most in 1 s %d (the more generous contract: %d + 1)\n", res.MostAcross, generous)
	if allowed := generous + 1 + jitterAllowance(generous, c.spread); res.MostAcross > allowed {
		return fmt.Errorf("while the change propagated the fleet exceeded the more generous contract: %d departures in one second (allowed %d)", res.MostAcross, allowed)
	}
	if allowed := c.change + 1 + jitterAllowance(c.change, c.spread); res.MostAfter > allowed {
		return fmt.Errorf("the new contract was exceeded once the fleet followed it: %d departures in one second (allowed %d)", res.MostAfter, allowed)
	}
	if c.change < c.rate && res.MostAfter < c.change*9/10 {
		return fmt.Errorf("after the change the fleet sent %d in its busiest second, well under the new %d/s", res.MostAfter, c.change)
	}
	return nil
}

// checkClamp measures a partner's clamp: from clampLead after the partner
// reported its calls left to its reset, the fleet sends at most that many.
// The caller holds p.mu.
func (c config) checkClamp(w io.Writer, res *Result, p *partner) error {
	if p.clampedAt.IsZero() {
		return fmt.Errorf("the partner never reported its calls left: lengthen -duration past -clamp-at")
	}
	from, to := p.clampedAt.Add(clampLead), p.clampedAt.Add(c.clampReset)
	res.ClampedPerProcess = make([]int, c.procs)
	for i, d := range p.departures {
		if !d.Before(from) && d.Before(to) {
			res.Clamped++
			if id := p.workers[i]; id >= 1 && id <= c.procs {
				res.ClampedPerProcess[id-1]++
			}
		}
	}
	fmt.Fprintf(w, "the partner reported %d calls left until its reset %v later; from %v after that to the reset the fleet sent %d %v\n",
		c.clamp, c.clampReset, clampLead, res.Clamped, res.ClampedPerProcess)
	if res.Clamped > c.clamp {
		return fmt.Errorf("the fleet sent %d calls where the partner had %d left", res.Clamped, c.clamp)
	}
	return nil
}

func sorted(ts []time.Time) []time.Time {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// jitterAllowance is the excess over rate + burst in a 1 s window that
// scheduling lateness can cause: spread's worth of the rate (measure sets
// it to the latest departure's lateness, at least 10 ms: 1 %), at least 1.
func jitterAllowance(rate int, spread time.Duration) int {
	spread = max(spread, 10*time.Millisecond)
	return max(1, int(math.Ceil(float64(rate)*spread.Seconds())))
}

// scriptCalls returns how many EVALSHA and EVAL calls the server counted
// since its statistics were reset (0 if it cannot tell).
func scriptCalls(client *redis.Client) int64 {
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			continue
		}
		if calls, ok := strings.CutPrefix(fields, "calls="); ok {
			calls, _, _ = strings.Cut(calls, ",")
			v, _ := strconv.ParseInt(calls, 10, 64)
			n += v
		}
	}
	return n
}
