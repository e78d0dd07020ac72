package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/throttlekit/throttlekit-go/internal/partnertest"
	"github.com/throttlekit/throttlekit-go/partner"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// fleetEnv makes the bench's test binary one process of a partner fleet
// (TestPartnerFleetProcess): it holds the process's orders, as JSON.
const fleetEnv = "THROTTLEKIT_BENCH_PARTNER_PROCESS"

// fleetOrders is what one process of a partner fleet runs.
type fleetOrders struct {
	Model   int       // index in partnerModels
	Window  int64     // ns: the model's window, scaled down (a minute's)
	Lib     string    // throttlekit, redis_rate, xrate
	Procs   int       // processes in the fleet (x/time/rate takes 1/Procs of the quota)
	Redis   string    // address
	Partner string    // the partner's URL
	Prefix  string    // the fleet's keys
	Clients int       // goroutines
	Seed    uint64    // of the process's draws
	End     time.Time // when to stop
}

// scaledModel returns m with its window scaled to w (a minute's models;
// the second's keep theirs), and its limit and counter with it.
func scaledModel(m partnerModel, w time.Duration) partnerModel {
	if m.span != time.Minute {
		return m
	}
	l := m.limit
	switch l.Model {
	case partner.Trailing:
		m.limit = partner.TrailingWindow(l.Name, l.Quota, w)
		m.counter = func() partnertest.Counter { return &partnertest.Trailing{Quota: l.Quota, Window: w} }
	case partner.FixedWindow:
		m.limit = partner.Window(l.Name, l.Quota, w)
		m.counter = func() partnertest.Counter { return &partnertest.Fixed{Quota: l.Quota, Window: w} }
	case partner.TokenBucket:
		m.limit = partner.Bucket(l.Name, l.Quota, shaper.Rate{Count: l.Quota, Period: w})
		m.counter = func() partnertest.Counter {
			return &partnertest.Bucket{Capacity: float64(l.Quota), Refill: float64(l.Quota) / w.Seconds()}
		}
	}
	m.xRate = rate.Limit(m.quota / w.Seconds())
	m.span = w
	return m
}

// TestPartnerFleetProcess is one process of a partner fleet when the bench
// runs its test binary with fleetEnv set (partnerProcesses); otherwise it
// does nothing.
func TestPartnerFleetProcess(t *testing.T) {
	orders := os.Getenv(fleetEnv)
	if orders == "" {
		t.Skip("a partner fleet's process: run by the bench report")
	}
	var o fleetOrders
	if err := json.Unmarshal([]byte(orders), &o); err != nil {
		t.Fatal(err)
	}
	m := scaledModel(partnerModels()[o.Model], time.Duration(o.Window))
	client := redis.NewClient(&redis.Options{Addr: o.Redis})
	defer client.Close()
	var wait waitFunc
	switch o.Lib {
	case "throttlekit":
		st := redisstore.New(client)
		defer st.Close()
		s, err := partner.New(st, []partner.Limit{m.limit}, partner.WithShaper(shaper.WithPrefix(o.Prefix)))
		if err != nil {
			t.Fatal(err)
		}
		wait = acquiring(s)
	case "redis_rate":
		l := redis_rate.NewLimiter(client)
		limit := redis_rate.Limit{Rate: int(m.quota), Burst: int(m.quota), Period: m.span}
		wait = func(ctx context.Context, cost int64) (func(int64), error) {
			for {
				res, err := l.AllowN(ctx, o.Prefix+"k", limit, int(cost))
				if err != nil {
					return nil, err
				}
				if res.Allowed > 0 {
					return nil, nil
				}
				time.Sleep(res.RetryAfter)
			}
		}
	case "xrate":
		l := rate.NewLimiter(m.xRate/rate.Limit(o.Procs), m.xBurst)
		wait = func(ctx context.Context, cost int64) (func(int64), error) { return nil, l.WaitN(ctx, int(cost)) }
	default:
		t.Fatalf("lib %q", o.Lib)
	}
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Clients}}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(o.Seed, 17))
	var wg sync.WaitGroup
	for range o.Clients {
		wg.Go(func() {
			ctx := context.Background()
			for time.Now().Before(o.End) {
				mu.Lock()
				est := m.cost(rng)
				use := max(int64(float64(est)*(m.used+(1-m.used)*rng.Float64())), 1)
				mu.Unlock()
				settle, err := wait(ctx, est) // a call refused is tried again as it was (playPartner)
				for err != nil && time.Now().Before(o.End) {
					time.Sleep(50 * time.Millisecond)
					settle, err = wait(ctx, est)
				}
				if err != nil {
					break
				}
				req, _ := http.NewRequest(http.MethodPost, o.Partner, nil)
				req.Header.Set("X-Cost", strconv.FormatInt(est, 10))
				req.Header.Set("X-Used", strconv.FormatInt(use, 10))
				resp, err := httpc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_ = resp.Body.Close()
				if settle != nil {
					if resp.StatusCode == http.StatusOK {
						settle(use)
					} else {
						settle(0) // the partner counted nothing for it
					}
				}
			}
		})
	}
	wg.Wait()
}

// partnerProcesses runs m, its window scaled to w, for windows spans in
// real time with procs OS processes of 16 goroutines each calling through
// lib and one Redis, against a partner (an HTTP server of this process)
// that counts m its own way on its own clock, and answers each call 20 to
// 500 ms later on a minute's window (proportionally sooner on a shorter
// one).
func partnerProcesses(t *testing.T, addr string, m partnerModel, index int, w time.Duration, windows, procs int, lib string) partnerRun {
	m = scaledModel(m, w)
	// counted from when the processes have started
	p := newPartnerCount(m, time.Now().Add(500*time.Millisecond), windows)
	var mu sync.Mutex // rng's
	rng := rand.New(rand.NewPCG(uint64(index), 23))
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		now := time.Now()
		est, _ := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
		use, _ := strconv.ParseInt(r.Header.Get("X-Used"), 10, 64)
		id, ok := p.admit(now, est, use)
		if !ok {
			rw.WriteHeader(http.StatusTooManyRequests)
			return
		}
		mu.Lock()
		latency := latencyOf(m, rng)
		mu.Unlock()
		time.Sleep(latency)
		p.done(time.Now(), id, use)
	}))
	defer srv.Close()
	prefix := fmt.Sprintf("pprocs-%s-%d-%d:", lib, index, time.Now().UnixNano())
	var cmds []*exec.Cmd
	for i := range procs {
		o, _ := json.Marshal(fleetOrders{Model: index, Window: int64(w), Lib: lib, Procs: procs, Redis: addr, Partner: srv.URL,
			Prefix: prefix, Clients: 16, Seed: uint64(i), End: p.end})
		cmd := exec.Command(os.Args[0], "-test.run=^TestPartnerFleetProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), fleetEnv+"="+string(o))
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("process %d of %s on %s: %v", i, lib, m.name, err)
		}
	}
	return p.run()
}

// partnerProcessesReport is the report's table of fleets of procs OS
// processes, each model beside redis_rate and x/time/rate.
func (r *report) partnerProcessesReport(t *testing.T, addr string, smokeRun bool) {
	const procs = 4
	w, windows := 3*time.Second, 4
	models := partnerModels()
	pick := func(int) bool { return true }
	if smokeRun {
		w, windows = time.Second, 2
		pick = func(i int) bool { return i == 0 || i == 5 } // a trailing tokens minute, nginx with a burst
	}
	r.printf("\n**OS processes through Redis, in real time.** Each model as above, its minute scaled down to %v (the seconds kept), for %d windows (a second's window: twice as many): 1 or %d processes of 16 goroutines each (the bench's test binary run again), one Redis, a partner that is an HTTP server of the bench's process counting its own way on its own clock. The lateness and jitter are the host's and the loopback's, not drawn. ThrottleKit declares the partner with the defaults (`partner.New`, 4 ms lateness, 1 ms jitter); redis_rate as its docs lead (`Limit{Rate: quota, Burst: quota, Period: window}`, `AllowN`, sleeping its `RetryAfter`); x/time/rate, which keeps no shared state, gives each process a quarter of the quota's rate and the largest call as its burst.\n\n", w, windows, procs)
	r.printf("| partner | ThrottleKit declared, 1 process: refused, quota used | ThrottleKit declared, %d processes | redis_rate, %d processes | x/time/rate, %d processes, a quarter each |\n| --- | --- | --- | --- | --- |\n", procs, procs, procs)
	for i, m := range models {
		if !pick(i) {
			continue
		}
		win := windows
		if m.span != time.Minute {
			win = 2 * windows // a second's window: as many seconds as a scaled minute's run, about
		}
		one := partnerProcesses(t, addr, m, i, w, win, 1, "throttlekit")
		tk := partnerProcesses(t, addr, m, i, w, win, procs, "throttlekit")
		rr := partnerProcesses(t, addr, m, i, w, win, procs, "redis_rate")
		x := partnerProcesses(t, addr, m, i, w, win, procs, "xrate")
		want := 0.97
		if m.name == "nginx limit_req 25r/s, no burst" {
			want = 0
		}
		r.printf("| %s | %d of %d, **%.1f%%** %s | %d of %d, **%.1f%%** %s | %d of %d, %.1f%% | %d of %d, %.1f%% |\n", m.name,
			one.refused, one.calls, 100*one.used, r.target(one.refused == 0 && one.used >= want, fmt.Sprintf("partner %s, 1 process: %d refused, %.1f%% used (target 0, %.0f%%)", m.name, one.refused, 100*one.used, 100*want)),
			tk.refused, tk.calls, 100*tk.used, r.target(tk.refused == 0 && tk.used >= want, fmt.Sprintf("partner %s, %d processes: %d refused, %.1f%% used (target 0, %.0f%%)", m.name, procs, tk.refused, 100*tk.used, 100*want)),
			rr.refused, rr.calls, 100*rr.used, x.refused, x.calls, 100*x.used)
	}
	r.printf("\n")
}
