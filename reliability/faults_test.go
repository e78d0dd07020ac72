//go:build faults

package reliability

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/shaper"
)

const (
	faultRate    = 100 // per second, burst 1
	faultWaiters = 8
	storeTimeout = 200 * time.Millisecond
)

// env is what a fault acts on.
type env struct {
	srv     *redistest.Server
	cluster *redistest.Cluster
	client  redis.UniversalClient
}

type scenario struct {
	name   string
	policy shaper.FailurePolicy
	// cluster runs the scenario on a 3-master, 3-replica Redis Cluster.
	cluster bool
	// extra are redis-server arguments.
	extra []string
	// inject causes the fault and returns when it is over, with its span.
	inject func(t *testing.T, e env) (from, to time.Time)
	// excess is what the contract may be exceeded by in a 1 s window, as
	// documented in docs/RELIABILITY.md: the slots already granted when the
	// store's state and the callers' diverge, at most one per waiter per
	// switch between schedules. FailLocal can switch twice in a second while
	// Redis comes back (local, Redis, local again after a timed-out call,
	// Redis), hence twice that.
	excess int
	// noErrors: the fault must not surface at all.
	noErrors bool
}

// jitter is the scheduling allowance of a wall-clock count (docs/SHAPER.md,
// "Slots and departures"): 1 % of the rate, at least 1.
const jitter = 1 + faultRate/100

var scenarios = []scenario{
	{name: "paused-2s/fail-closed", policy: shaper.FailClosed, inject: pauseFor(2 * time.Second), excess: faultWaiters},
	{name: "paused-2s/fail-open", policy: shaper.FailOpen, inject: pauseFor(2 * time.Second), excess: faultWaiters},
	{name: "paused-2s/fail-local", policy: shaper.FailLocal(1), inject: pauseFor(2 * time.Second), excess: 2 * faultWaiters},
	{name: "killed-restarted/fail-closed", policy: shaper.FailClosed, excess: faultWaiters, inject: func(t *testing.T, e env) (time.Time, time.Time) {
		from := time.Now()
		e.srv.Kill()
		time.Sleep(time.Second)
		to := time.Now() // the fault ends as the new process starts answering
		e.srv.Restart()  // a fresh process: every key is gone
		return from, to
	}},
	{name: "script-flush/fail-closed", policy: shaper.FailClosed, noErrors: true, inject: func(t *testing.T, e env) (time.Time, time.Time) {
		from := time.Now()
		for range 10 {
			if err := e.client.ScriptFlush(bg).Err(); err != nil {
				t.Errorf("SCRIPT FLUSH: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		return from, time.Now()
	}},
	{name: "slow-command/fail-closed", policy: shaper.FailClosed, extra: []string{"--enable-debug-command", "yes"}, inject: debugSleep(2), excess: faultWaiters},
	{name: "slow-command/fail-local", policy: shaper.FailLocal(1), extra: []string{"--enable-debug-command", "yes"}, inject: debugSleep(2), excess: 2 * faultWaiters},
	{name: "cluster-master-killed/fail-closed", policy: shaper.FailClosed, cluster: true, excess: faultWaiters, inject: func(t *testing.T, e env) (time.Time, time.Time) {
		cc := e.client.(*redis.ClusterClient)
		master, err := cc.MasterForKey(bg, "{k}")
		if err != nil {
			t.Fatal(err)
		}
		node := e.cluster.Node(master.Options().Addr)
		if node == nil {
			t.Fatalf("no node at %s", master.Options().Addr)
		}
		from := time.Now()
		node.Kill()
		// The fault lasts until a replica serves the slot as master.
		for time.Since(from) < 30*time.Second {
			m, err := cc.MasterForKey(bg, "{k}")
			if err == nil && m.Options().Addr != node.Addr() && m.Ping(bg).Err() == nil {
				return from, time.Now()
			}
			cc.ReloadState(bg)
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("no replica was promoted within 30 s")
		return from, time.Now()
	}},
}

// quiet silences go-redis's connection-pool log lines, which a fault makes
// by the thousand.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }

func pauseFor(d time.Duration) func(*testing.T, env) (time.Time, time.Time) {
	return func(t *testing.T, e env) (time.Time, time.Time) {
		from := time.Now()
		e.srv.Pause()
		time.Sleep(d)
		e.srv.Resume()
		return from, time.Now()
	}
}

// debugSleep blocks the server with DEBUG SLEEP from another connection.
func debugSleep(seconds int) func(*testing.T, env) (time.Time, time.Time) {
	return func(t *testing.T, e env) (time.Time, time.Time) {
		c := e.srv.Client()
		from := time.Now()
		if err := c.Do(bg, "DEBUG", "SLEEP", seconds).Err(); err != nil {
			t.Errorf("DEBUG SLEEP: %v", err)
		}
		return from, time.Now()
	}
}

func TestFaults(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { runScenario(t, sc) })
	}
}

func runScenario(t *testing.T, sc scenario) {
	var e env
	if sc.cluster {
		e.cluster = redistest.StartClusterWithReplicas(t)
		e.client = e.cluster.Client(t)
	} else {
		e.srv = redistest.Start(t, sc.extra...)
		e.client = e.srv.Client(func(o *redis.Options) { o.PoolSize = 32 })
	}
	store := shaper.NewRedisStore(e.client, shaper.WithTimeout(storeTimeout), shaper.WithFailurePolicy(sc.policy))
	defer store.Close()
	s, err := shaper.New(store, shaper.PerSecond(faultRate), shaper.WithName("faults"), shaper.WithMaxQueue(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	probe, err := shaper.New(store, shaper.PerSecond(10000), shaper.WithName("probe"))
	if err != nil {
		t.Fatal(err)
	}

	ctx, stop := context.WithCancel(bg)
	rec := newRecorder()
	start := time.Now()
	wg := load(ctx, s, "k", faultWaiters, rec)
	time.Sleep(2 * time.Second)
	from, to := sc.inject(t, e)

	// Recovery: the first probe after the fault that Redis itself served.
	recovered := time.Duration(-1)
	for time.Since(to) < 20*time.Second {
		degraded := false
		pctx := shaper.WithTrace(bg, &shaper.Trace{Degraded: func(context.Context, string) { degraded = true }})
		if _, err := probe.Reserve(pctx, "p", 1); err == nil && !degraded {
			recovered = time.Since(to)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2500 * time.Millisecond) // run on after recovery
	stop()
	wg.Wait()
	end := time.Now()

	deps := rec.departures()
	during := between(deps, from.Add(storeTimeout+100*time.Millisecond), to)
	faultLen := to.Sub(from)
	allowed := faultRate + 1 + jitter + sc.excess
	winFrom, winTo := start, end
	if sc.policy == shaper.FailOpen { // the contract is not enforced while open: check outside
		winTo = from.Add(-time.Second)
	}
	most, at := mostIn(deps, time.Second, winFrom, winTo)
	// Steady state: from a second after recovery, the contract as usual.
	after, _ := mostIn(deps, time.Second, to.Add(max(recovered, 0)+time.Second), end.Add(-time.Second))
	rec.mu.Lock()
	errs := fmt.Sprint(rec.errs)
	rec.mu.Unlock()
	report := fmt.Sprintf("%-36s fault %6v  recovery %8v  departures %4d (during the fault %3d)  most in 1 s %3d (allowed %d; steady after %3d)  degraded %4d  errors %s",
		sc.name, faultLen.Round(time.Millisecond), recovered.Round(time.Millisecond), len(deps), during, most, allowed, after, store.Degraded(), errs)
	fmt.Println(report)
	t.Log(report)

	if recovered < 0 {
		t.Fatalf("the store did not recover within 20 s of the fault's end")
	}
	if most > allowed {
		t.Errorf("%d departures in the 1 s from %v (%.2fs into the run): allowed %d", most, at.Format("15:04:05.000"), at.Sub(start).Seconds(), allowed)
	}
	if after > faultRate+1+jitter {
		t.Errorf("after recovery %d departures in 1 s, allowed %d", after, faultRate+1+jitter)
	}
	if sc.noErrors && len(rec.errs) > 0 {
		t.Errorf("the fault surfaced: %s", errs)
	}
	if after < faultRate/2 {
		t.Errorf("after recovery only %d departures in the busiest second: the load did not resume", after)
	}
	switch {
	case sc.noErrors:
	case sc.policy == shaper.FailClosed:
		// No slot is granted by a store that cannot answer, and callers get
		// errors; a request granted before the fault may still depart late
		// (its pause re-read fails), at most one per waiter.
		if during > faultWaiters {
			t.Errorf("FailClosed: %d departures during the fault, at most %d were granted before it", during, faultWaiters)
		}
		if rec.errs["store"]+rec.errs["deadline"] == 0 {
			t.Errorf("FailClosed: no caller saw the fault: %s", errs)
		}
	case sc.policy == shaper.FailOpen:
		if during == 0 || store.Degraded() == 0 {
			t.Errorf("FailOpen: %d departures during the fault, %d degraded: the policy did not serve", during, store.Degraded())
		}
	default: // FailLocal(1): paced locally at the full rate
		limit := int(faultLen.Seconds()*faultRate) + 1 + jitter + faultWaiters
		if during == 0 || during > limit {
			t.Errorf("FailLocal: %d departures in a %v fault, want 1..%d", during, faultLen, limit)
		}
	}
}
