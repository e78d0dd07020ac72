// Command fair-tenants shows tenants taking turns on one partner key
// (shaper.WithFlow): a worker pool (queue.Queue) paced at -rate on one key,
// the jobs of each tenant submitted with its flow, and the departures each
// tenant got, second by second.
//
// In one process (the default: the in-memory store, about 10 s):
//
//   - "backfill" (shaper.Batch, weight 1) queues a large backlog at 0 s and
//     has the whole rate to itself;
//   - "acme" (weight 3) and "globex" (weight 1), both shaper.Normal, queue
//     backlogs at 2 s: neither waits behind backfill's backlog, queued
//     first. From then on the Normal class takes 9 turns in 10, acme 3/4
//     of them and globex 1/4, and backfill keeps the 10th (a lower class
//     gets one turn after shaper.DefaultMaxPriorityRun in a row over it);
//   - "support" (shaper.Interactive) submits one job every 1.5 s from
//     4 s: each goes before every backlog, at the first slot not yet
//     granted when it arrives (the process holds one slot ahead of the
//     turns), or one slot later when backfill's owed turn is due then: it
//     waits one to three slots (a slot is 1/rate).
//
// A job's departure is the instant the queue calls its Run. The program
// prints the departures per second of each tenant with acme's and globex's
// shares of the Normal class, the figures against the expected ones, and
// each support job's wait. No second may hold more than the rate and its
// burst (1, PerSecond's default).
//
// With -procs n it is a fleet: the parent starts n copies of itself (and a
// redis-server on a free port unless -redis is given), each running one
// tenant's backlog through its own queue on a redisstore-backed shaper of
// the same name and key; "acme" (weight 3) and "globex" (weight 1) are
// spread round-robin over the processes. The turns are decided in Redis
// fleet-wide, so acme gets 3/4 of the departures though its jobs and
// globex's never meet in one process. The parent prints the per-second
// table across the processes, the shares after the first second, the
// throughput and the busiest 1 s window against the rate and its burst.
//
//	go run ./examples/fair-tenants
//	go run ./examples/fair-tenants -rate 50 -duration 20s
//	go run ./examples/fair-tenants -short   # a 3 s run
//	go run ./examples/fair-tenants -procs 2 -rate 50
//	go run ./examples/fair-tenants -procs 2 -redis localhost:6379
//	go run ./examples/fair-tenants -json    # end with the figures as one JSON line
//
// Fleet mode without -redis needs redis-server on PATH (Debian: apt-get
// install redis-server).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit-go/examples/internal/window"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/queue"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// key is the partner's key every tenant's jobs are paced on.
const key = "partner"

// call is how long a job's call to the partner takes: a worker is busy
// that long after each departure.
const call = 20 * time.Millisecond

// The tenants of the in-memory run.
var (
	backfill = shaper.Flow{Name: "backfill", Weight: 1, Priority: shaper.Batch}
	acme     = shaper.Flow{Name: "acme", Weight: 3, Priority: shaper.Normal}
	globex   = shaper.Flow{Name: "globex", Weight: 1, Priority: shaper.Normal}
	support  = shaper.Flow{Name: "support", Weight: 1, Priority: shaper.Interactive}
)

type config struct {
	rate     int
	workers  int
	duration time.Duration
	procs    int    // 0: one process, in memory; else a fleet on Redis
	redis    string // the fleet's Redis ("": start one)
	name     string // the shaper's name, shared by the fleet (set by the parent)
}

// burst is the burst of shaper.PerSecond(rate): Rate.Burst 0 means 1.
const burst = 1

func main() {
	var c config
	flag.IntVar(&c.rate, "rate", 20, "the partner key's rate, jobs per second")
	flag.IntVar(&c.workers, "workers", 4, "workers of each queue")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "how long the run lasts (at least 3s)")
	short := flag.Bool("short", false, "a 3 s run (CI smoke)")
	flag.IntVar(&c.procs, "procs", 0, "fleet mode: this many processes share the key through Redis (0: one process, in memory)")
	flag.StringVar(&c.redis, "redis", "", "fleet mode: Redis address (default: start redis-server on a free port)")
	flag.StringVar(&c.name, "name", "", "the shaper's name (set by the parent for its processes)")
	asJSON := flag.Bool("json", false, "end with the figures as one JSON line")
	flag.Parse()
	if *short {
		c.duration = 3 * time.Second
	}

	var res Result
	var err error
	switch id := os.Getenv(childEnv); {
	case id != "":
		err = child(id, c)
	case c.procs > 0:
		res, err = fleet(os.Stdout, c)
	default:
		res, err = local(os.Stdout, c)
	}
	if *asJSON && res.Rate > 0 {
		_ = json.NewEncoder(os.Stdout).Encode(res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fair-tenants:", err)
		os.Exit(1)
	}
}

func (c config) check() error {
	switch {
	case c.rate < 1 || c.workers < 1:
		return errors.New("need -rate and -workers >= 1")
	case c.duration < 3*time.Second:
		return errors.New("need -duration >= 3s")
	case c.procs < 0:
		return errors.New("need -procs >= 0")
	}
	return nil
}

// timeline is when the in-memory run's tenants submit, after its start.
type timeline struct {
	normal       time.Duration // acme's and globex's backlogs
	supportFrom  time.Duration // support's first job
	supportEvery time.Duration // and the next ones
	supportUntil time.Duration // none after this: each departs within the run
}

// timeline is 2 s, from 4 s every 1.5 s for runs of 8 s and more; 1 s,
// from 2 s every 0.5 s for shorter ones.
func (c config) timeline() timeline {
	tl := timeline{normal: 2 * time.Second, supportEvery: 1500 * time.Millisecond}
	if c.duration < 8*time.Second {
		tl = timeline{normal: time.Second, supportEvery: 500 * time.Millisecond}
	}
	tl.supportFrom = 2 * tl.normal
	tl.supportUntil = c.duration - 500*time.Millisecond
	return tl
}

// dep is one departure: whose job, when the queue called its Run, and how
// long after its submission.
type dep struct {
	tenant string
	at     time.Time
	wait   time.Duration
}

// recorder records the departures of a queue's jobs and the failures its
// error handler receives.
type recorder struct {
	mu          sync.Mutex
	deps        []dep
	failed      int
	unavailable int
	firstErr    error
	over        context.Context // done once the run is over
}

// job returns a job of tenant, submitted now: its Run records its
// departure (time.Now() as it is called: what the partner would see) and
// calls the partner.
func (r *recorder) job(tenant string) queue.Job {
	submitted := time.Now()
	return queue.Job{Key: key, Run: func(ctx context.Context) error {
		at := time.Now()
		r.mu.Lock()
		r.deps = append(r.deps, dep{tenant, at, at.Sub(submitted)})
		r.mu.Unlock()
		t := time.NewTimer(call)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return nil
	}}
}

// fail is the queue's error handler. The jobs still waiting for their
// turn when the run is over are cancelled (context.Canceled): those are
// expected. A store that did not answer in time is counted apart.
func (r *recorder) fail(_ queue.Job, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.over.Err() != nil && errors.Is(err, context.Canceled):
	case errors.Is(err, shaper.ErrStoreUnavailable):
		r.unavailable++
	default:
		r.failed++
		if r.firstErr == nil {
			r.firstErr = err
		}
	}
}

// local is the in-memory run (see the package comment).
func local(w io.Writer, c config) (Result, error) {
	if err := c.check(); err != nil {
		return Result{}, err
	}
	store := memstore.New()
	defer store.Close()
	// MaxQueue an hour: the backlogs are cut off by the run's end, not
	// refused when they are queued.
	s, err := shaper.New(store, shaper.PerSecond(int64(c.rate)), shaper.WithName("fair-tenants"), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		return Result{}, err
	}
	tl := c.timeline()
	// Each backlog holds more jobs than the whole run could send.
	backlog := c.rate*int(c.duration/time.Second) + c.rate

	fmt.Fprintf(w, "one key at %d/s (burst %d), %d workers, %v, in memory\n", c.rate, burst, c.workers, c.duration)
	fmt.Fprintf(w, "at 0s backfill (Batch, weight 1) queues %d jobs; at %v acme (Normal, weight 3) and globex (Normal, weight 1) %d each;\n", backlog, tl.normal, backlog)
	fmt.Fprintf(w, "from %v support (Interactive) submits 1 job every %v\n\n", tl.supportFrom, tl.supportEvery)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{over: ctx}
	q := queue.New(s, queue.WithWorkers(c.workers), queue.WithErrorHandler(rec.fail))
	start := time.Now()
	end := start.Add(c.duration)
	var wg sync.WaitGroup
	at := func(d time.Duration, f func()) {
		wg.Go(func() {
			t := time.NewTimer(time.Until(start.Add(d)))
			defer t.Stop()
			select {
			case <-t.C:
				f()
			case <-ctx.Done():
			}
		})
	}
	submit := func(f shaper.Flow, n int) {
		fctx := shaper.WithFlow(ctx, f)
		for range n {
			if err := q.Submit(fctx, rec.job(f.Name)); err != nil {
				rec.fail(queue.Job{}, err)
			}
		}
	}
	at(0, func() { submit(backfill, backlog) })
	at(tl.normal, func() { submit(acme, backlog); submit(globex, backlog) })
	for d := tl.supportFrom; d <= tl.supportUntil; d += tl.supportEvery {
		at(d, func() { submit(support, 1) })
	}
	time.Sleep(time.Until(end))
	cancel() // the run is over: the jobs still waiting leave
	wg.Wait()
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	if err := q.Close(cctx); err != nil {
		return Result{}, err
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	res := analyze(c, rec.deps, start, end, tl.normal)
	res.Mode = "memory"
	res.Failed, res.Unavailable = rec.failed, rec.unavailable
	for _, d := range rec.deps {
		if d.tenant == support.Name {
			res.InteractiveWaits = append(res.InteractiveWaits, math.Round(10*ms(d.wait))/10)
		}
	}
	names := []string{backfill.Name, acme.Name, globex.Name, support.Name}
	printTable(w, names, res)
	rep := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	rep("")
	rep("expected from %v: acme 75%% and globex 25%% of the Normal class, which takes 9 turns in 10 while backfill (Batch) waits: backfill about 10%%", tl.normal)
	rep("measured from %v: acme %.1f%% of the Normal class (acme:globex %.2f:1), backfill %.1f%% of all; %.1f departures/s",
		tl.normal, 100*res.AcmeShare, res.AcmeToGlobex, 100*res.BatchShare, res.Throughput)
	rep("busiest 1 s window: %d departures (rate + burst: %d)", res.Busiest, c.rate+burst)
	waits := make([]string, len(res.InteractiveWaits))
	for i, d := range res.InteractiveWaits {
		waits[i] = fmt.Sprintf("%.0fms", d)
	}
	rep("support's waits, Submit to Run (a slot is %v; expected 1 to 3 slots: the first slot not yet granted, or the next when backfill's owed turn is due): %s", slot(c.rate), strings.Join(waits, " "))
	if res.Failed > 0 {
		return res, fmt.Errorf("%d jobs failed; the first: %v", res.Failed, rec.firstErr)
	}
	return res, nil
}

// Result is what a run measured.
type Result struct {
	Mode     string  `json:"mode"` // "memory", or "redis" (a fleet)
	Rate     int     `json:"rate"`
	Burst    int     `json:"burst"`
	Duration float64 `json:"duration_s"`
	// Departures by tenant, second by second from the start.
	PerSecond []map[string]int `json:"per_second"`
	// The figures below but Busiest count the departures from From
	// seconds after the start to the end: from when acme and globex both
	// have backlogs (in memory), from the first second on (a fleet, whose
	// processes start their backlogs at slightly different instants).
	From         float64        `json:"from_s"`
	Departures   map[string]int `json:"departures"`
	AcmeShare    float64        `json:"acme_share"`            // of acme's and globex's departures (the Normal class)
	AcmeToGlobex float64        `json:"acme_to_globex"`        // acme's departures per globex's
	BatchShare   float64        `json:"batch_share,omitempty"` // backfill's share of all departures
	Throughput   float64        `json:"throughput"`            // departures per second
	// Busiest is the most departures in any 1 s window of the run
	// (window.MostInOneSecond): at most Rate + Burst.
	Busiest int `json:"busiest_1s"`
	// InteractiveWaits are the waits of support's jobs (in memory), from
	// Submit to Run, in ms.
	InteractiveWaits []float64 `json:"interactive_waits_ms,omitempty"`
	PerProcess       []int     `json:"per_process,omitempty"` // departures of each process of a fleet
	Failed           int       `json:"failed"`                // jobs that failed, other than those the run's end cut off
	// Unavailable counts the jobs refused because the store did not
	// answer in time (an overloaded host).
	Unavailable int `json:"unavailable"`
}

// analyze counts deps, those of the run [start, end), and the shares from
// from after start on.
func analyze(c config, deps []dep, start, end time.Time, from time.Duration) Result {
	res := Result{Rate: c.rate, Burst: burst, Duration: end.Sub(start).Seconds(), From: from.Seconds(), Departures: map[string]int{}}
	res.PerSecond = make([]map[string]int, int((end.Sub(start)+time.Second-1)/time.Second))
	for i := range res.PerSecond {
		res.PerSecond[i] = map[string]int{}
	}
	var ts []time.Time
	for _, d := range deps {
		if d.at.Before(start) || !d.at.Before(end) {
			continue
		}
		ts = append(ts, d.at)
		res.PerSecond[d.at.Sub(start)/time.Second][d.tenant]++
		if d.at.Sub(start) >= from {
			res.Departures[d.tenant]++
		}
	}
	slices.SortFunc(ts, time.Time.Compare)
	res.Busiest = window.MostInOneSecond(ts)
	total := 0
	for _, n := range res.Departures {
		total += n
	}
	a, g := res.Departures[acme.Name], res.Departures[globex.Name]
	res.AcmeShare = ratio(a, a+g)
	res.AcmeToGlobex = ratio(a, g)
	res.BatchShare = ratio(res.Departures[backfill.Name], total)
	res.Throughput = float64(total) / (end.Sub(start) - from).Seconds()
	return res
}

// printTable prints the departures per second of the tenants names, and
// acme's and globex's shares of the Normal class.
func printTable(w io.Writer, names []string, res Result) {
	fmt.Fprintln(w, "departures per second by tenant; acme% and globex% are their shares of the Normal class (acme + globex) that second")
	fmt.Fprintf(w, "%4s", "sec")
	for _, n := range names {
		fmt.Fprintf(w, " %8s", n)
	}
	fmt.Fprintf(w, " %6s %6s %7s\n", "total", "acme%", "globex%")
	for i, sec := range res.PerSecond {
		fmt.Fprintf(w, "%4d", i)
		total := 0
		for _, n := range names {
			fmt.Fprintf(w, " %8d", sec[n])
			total += sec[n]
		}
		fmt.Fprintf(w, " %6d", total)
		if a, g := sec[acme.Name], sec[globex.Name]; a+g > 0 {
			fmt.Fprintf(w, " %6.1f %7.1f\n", 100*ratio(a, a+g), 100*ratio(g, a+g))
		} else {
			fmt.Fprintf(w, " %6s %7s\n", "-", "-")
		}
	}
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func slot(rate int) time.Duration { return time.Second / time.Duration(rate) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
