package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/examples/internal/redisproc"
	"github.com/throttlekit/throttlekit-go/queue"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// childEnv marks a process of the fleet: its value is the process's
// number, from 0.
const childEnv = "THROTTLEKIT_FAIR_TENANTS_PROC"

// fleetTenants are spread round-robin over the fleet's processes: process
// i runs fleetTenants[i % 2]'s backlog.
var fleetTenants = []shaper.Flow{acme, globex}

// warmup is the start of a fleet's run left out of the shares and the
// throughput: the processes start their backlogs at slightly different
// instants, and the first to ask has the key to itself meanwhile.
const warmup = time.Second

// message is a line a process and the parent exchange as JSON: the process
// says it is ready, the parent says when to start and stop, the process
// reports.
type message struct {
	Ready bool  `json:"ready,omitempty"` // process: its shaper has reached Redis
	Start int64 `json:"start,omitempty"` // parent: Unix ns
	End   int64 `json:"end,omitempty"`   // parent: Unix ns

	Tenant      string  `json:"tenant,omitempty"`
	Departures  []int64 `json:"departures,omitempty"` // Unix ns, as its queue called Run
	Failed      int     `json:"failed,omitempty"`
	Error       string  `json:"error,omitempty"` // the first failure
	Unavailable int     `json:"unavailable,omitempty"`
}

// fleetShaper is the shaper of every process: one rate, one name (so one
// prefix: one fair order per key, fleet-wide), on Redis.
func (c config) fleetShaper(client *redis.Client) (*shaper.Shaper, *redisstore.Store, error) {
	// A call that cannot reach Redis within a second fails: the default
	// 250 ms is tighter than a loaded laptop running the fleet needs.
	store := redisstore.New(client, redisstore.WithTimeout(time.Second))
	s, err := shaper.New(store, shaper.PerSecond(int64(c.rate)), shaper.WithName(c.name), shaper.WithMaxQueue(time.Hour))
	if err != nil {
		_ = store.Close()
		return nil, nil, err
	}
	return s, store, nil
}

// child is one process of the fleet: it says it is ready, reads when to
// start and stop from stdin, then queues its tenant's backlog (more than
// the whole run could send) and runs it through its own queue until the
// end, and reports every departure on stdout.
//
// A departure is time.Now() as the queue calls the job's Run (a Run gets
// no reservation to read a slot from): the instant the partner's call
// would start, what the partner sees, the queue's and the scheduler's lag
// behind the slot included. The slots themselves are granted in Redis
// (on Redis TIME, the same host clock here) and conform to the rate
// exactly; the lag only moves a departure later, by a few ms, so the
// busiest 1 s window of departures may hold one more than the slots
// would: which the burst above the rate allows for.
func child(id string, c config) error {
	i, err := strconv.Atoi(id)
	if err != nil || i < 0 {
		return fmt.Errorf("%s=%q: not a process number", childEnv, id)
	}
	f := fleetTenants[i%len(fleetTenants)]
	client := redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: 16})
	defer client.Close()
	s, store, err := c.fleetShaper(client)
	if err != nil {
		return err
	}
	defer store.Close()
	// Ready once Redis answered: the run does not start with a dial.
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
	start, end := time.Unix(0, run.Start), time.Unix(0, run.End)
	time.Sleep(time.Until(start))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	over := time.AfterFunc(time.Until(end), cancel) // the run is over: the jobs still waiting leave
	defer over.Stop()
	rec := &recorder{over: ctx}
	q := queue.New(s, queue.WithWorkers(c.workers), queue.WithErrorHandler(rec.fail))
	fctx := shaper.WithFlow(ctx, f)
	backlog := c.rate*int(end.Sub(start)/time.Second) + c.rate
	for range backlog {
		if err := q.Submit(fctx, rec.job(f.Name)); err != nil {
			rec.fail(queue.Job{}, err)
		}
	}
	<-ctx.Done()
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	if err := q.Close(cctx); err != nil {
		return err
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	rep := message{Tenant: f.Name, Failed: rec.failed, Unavailable: rec.unavailable}
	if rec.firstErr != nil {
		rep.Error = rec.firstErr.Error()
	}
	for _, d := range rec.deps {
		rep.Departures = append(rep.Departures, d.at.UnixNano())
	}
	return out.Encode(rep)
}

// proc is a process of the fleet, as the parent runs it.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *json.Decoder
	stderr strings.Builder
}

func (c config) start(self string, i int) (*proc, error) {
	p := &proc{cmd: exec.Command(self, "-rate", strconv.Itoa(c.rate), "-workers", strconv.Itoa(c.workers), "-redis", c.redis, "-name", c.name)}
	p.cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(i))
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

// fleet runs c.procs processes sharing the key through Redis, and prints
// and returns what they measured.
func fleet(w io.Writer, c config) (Result, error) {
	if err := c.check(); err != nil {
		return Result{}, err
	}
	if c.redis == "" {
		addr, stop, err := redisproc.Start(false)
		if err != nil {
			return Result{}, err
		}
		defer stop()
		c.redis = addr
	}
	// A name of its own: what an earlier run left on this Redis (flows
	// still counted as waiting, a schedule ahead) does not count in this
	// one.
	c.name = "fair-tenants-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	self, err := os.Executable()
	if err != nil {
		return Result{}, err
	}
	tenants := make([]string, c.procs)
	for i := range tenants {
		tenants[i] = fleetTenants[i%len(fleetTenants)].Name
	}
	fmt.Fprintf(w, "%d processes share one key at %d/s (burst %d) through Redis at %s, %v; each runs one tenant's backlog through its own queue of %d workers:\n",
		c.procs, c.rate, burst, c.redis, c.duration, c.workers)
	for i, t := range tenants {
		fmt.Fprintf(w, "  process %d: %s (weight %g)\n", i, t, fleetTenants[i%len(fleetTenants)].Weight)
	}
	fmt.Fprintln(w)

	procs := make([]*proc, c.procs)
	defer func() {
		for _, p := range procs {
			if p != nil && p.cmd.Process != nil && p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		}
	}()
	for i := range procs {
		if procs[i], err = c.start(self, i); err != nil {
			return Result{}, err
		}
	}
	for i, p := range procs {
		var m message
		if err := p.stdout.Decode(&m); err != nil || !m.Ready {
			_ = p.cmd.Wait()
			return Result{}, fmt.Errorf("process %d did not start: %v: %s", i, err, p.stderr.String())
		}
	}
	// One start for all, whenever each process came up.
	start := time.Now().Add(100 * time.Millisecond)
	end := start.Add(c.duration)
	for _, p := range procs {
		if err := json.NewEncoder(p.stdin).Encode(message{Start: start.UnixNano(), End: end.UnixNano()}); err != nil {
			return Result{}, err
		}
	}
	reps := make([]message, c.procs)
	var errs []error
	for i, p := range procs {
		err := p.stdout.Decode(&reps[i])
		if werr := p.cmd.Wait(); werr != nil || err != nil {
			errs = append(errs, fmt.Errorf("process %d: %v %v: %s", i, err, werr, p.stderr.String()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}

	var deps []dep
	perProcess := make([]int, c.procs)
	failed, unavailable, firstErr := 0, 0, ""
	for i, r := range reps {
		for _, d := range r.Departures {
			at := time.Unix(0, d)
			deps = append(deps, dep{tenant: r.Tenant, at: at})
			if !at.Before(start) && at.Before(end) {
				perProcess[i]++
			}
		}
		failed += r.Failed
		unavailable += r.Unavailable
		if firstErr == "" {
			firstErr = r.Error
		}
	}
	res := analyze(c, deps, start, end, warmup)
	res.Mode, res.PerProcess, res.Failed, res.Unavailable = "redis", perProcess, failed, unavailable

	names := []string{acme.Name}
	if c.procs > 1 {
		names = append(names, globex.Name)
	}
	printTable(w, names, res)
	rep := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	rep("")
	for i, n := range perProcess {
		rep("process %d (%s): %d departures", i, tenants[i], n)
	}
	want := 1.0
	if c.procs > 1 {
		want = acme.Weight / (acme.Weight + globex.Weight)
	}
	rep("from %v on: acme %.1f%% of the departures (expected %.0f%%, its weight's share), acme:globex %.2f:1; %.1f departures/s (%.1f%% of %d/s)",
		warmup, 100*res.AcmeShare, 100*want, res.AcmeToGlobex, res.Throughput, 100*res.Throughput/float64(c.rate), c.rate)
	rep("busiest 1 s window: %d departures (rate + burst: %d)", res.Busiest, c.rate+burst)
	if res.Unavailable > 0 {
		rep("jobs refused because Redis did not answer within 1 s (an overloaded host): %d", res.Unavailable)
	}
	if res.Failed > 0 {
		return res, fmt.Errorf("%d jobs failed; the first: %s", res.Failed, firstErr)
	}
	return res, nil
}
