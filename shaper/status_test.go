package shaper

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
	"github.com/throttlekit/throttlekit-go/internal/timer"
	"github.com/throttlekit/throttlekit-go/memstore"
	"github.com/throttlekit/throttlekit-go/redisstore"
)

// statusText renders st with instants relative to now.
func statusText(st Status, now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rem %d next +%v reset +%v binding %q", st.Remaining, st.Next.Sub(now), st.ResetAt.Sub(now), st.Binding)
	for _, d := range st.Dimensions {
		fmt.Fprintf(&b, " [%s %s rem %d next +%v reset +%v]", d.Name, d.Key, d.Remaining, d.Next.Sub(now), d.ResetAt.Sub(now))
	}
	return b.String()
}

// probeStatus reads key's status for cost and checks what Status alone
// must satisfy: no instant before now (a cost above the burst may depart
// after the key is cold: ResetAt can come before Next), the binding dimension's figures on
// top, ResetAt the latest, and, for a shaper of one contract, Remaining
// exact (Remaining units depart at once, one more does not).
func probeStatus(t *testing.T, s *Shaper, clock *timer.Fake, key string, cost int64) (Status, error) {
	t.Helper()
	now := clock.Now()
	st, err := s.Status(bg, key, cost)
	if err != nil {
		if !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("Status(%q, %d): %v", key, cost, err)
		}
		return st, err
	}
	if st.Next.Before(now) || st.ResetAt.Before(now) || st.ResetAt.Before(st.PausedUntil) ||
		st.Binding == "pause" && (!st.Next.Equal(st.PausedUntil) || !st.Next.After(now)) {
		t.Fatalf("Status(%q, %d) at %v: %s", key, cost, now, statusText(st, now))
	}
	if len(st.Dimensions) != len(s.cur.Load().dims) {
		t.Fatalf("Status has %d dimensions, the shaper %d", len(st.Dimensions), len(s.cur.Load().dims))
	}
	for _, d := range st.Dimensions {
		if d.ResetAt.After(st.ResetAt) {
			t.Fatalf("dimension %s is cold at %v, after the key's ResetAt %v", d.Name, d.ResetAt, st.ResetAt)
		}
	}
	if st.Binding != "pause" {
		found := false
		for _, d := range st.Dimensions {
			if d.Name == st.Binding {
				found = d.Next.Equal(st.Next) && (d.Remaining == st.Remaining || st.Remaining == 0 && st.PausedUntil.After(now))
			}
		}
		if !found {
			t.Fatalf("the binding dimension %q does not carry the key's figures: %s", st.Binding, statusText(st, now))
		}
	}
	if len(s.cur.Load().dims) == 1 && st.Binding == "" && st.Remaining > 0 && st.Remaining <= 1<<20 {
		at, err := s.Status(bg, key, st.Remaining)
		if err == nil && !at.Next.Equal(now) {
			t.Fatalf("%s: Status says %d remain, but a request of %d departs at +%v", s.cur.Load().dims[0].Alg.Name(), st.Remaining, st.Remaining, at.Next.Sub(now))
		}
		// Under a partner's clamp one request departs per slot, whatever
		// its cost: Remaining counts requests of one unit (at most 1), and
		// a larger one still departs at once.
		more, err := s.Status(bg, key, st.Remaining+1)
		if err == nil && !more.Next.After(now) && !clampHolds(t, s, key) {
			t.Fatalf("Status says %d remain, but a request of %d departs at once", st.Remaining, st.Remaining+1)
		}
	}
	return st, nil
}

// clampHolds reports whether a partner's clamp (Shaper.Clamp) holds one of
// key's dimension keys at the shaper's now, as the clamps s set in its
// store say (see watchClamps, which s must run under).
func clampHolds(t *testing.T, s *Shaper, key string) bool {
	t.Helper()
	w, ok := s.store.(*clampWatch)
	if !ok {
		t.Fatalf("clampHolds: the shaper's store (%T) is not watched (watchClamps)", s.store)
	}
	ks, err := s.keysOf(s.cur.Load(), key)
	if err != nil {
		t.Fatal(err)
	}
	return w.holds(ks, algorithms.Millis(s.cfg.clock.Now()))
}

// clampWatch is a shaper's store seen through the calls the shaper makes
// (package shaper cannot read a store's own state): it records the
// partners' clamps the shaper sets on keys (Backend.Clamp: each key's
// clamp ends span after now, whatever was before) and forgets them when it
// resets a key (Backend.Reset), as both stores do. Every other call passes
// unchanged; the single-key branch (Shaper.one) is not affected.
type clampWatch struct {
	store.Backend
	mu   sync.Mutex
	ends map[string]float64 // dimension namespace + "\x00" + key: the end of its clamp, ms
}

// watchClamps makes s's store a clampWatch (once), before s is used.
func watchClamps(s *Shaper) {
	if _, ok := s.store.(*clampWatch); !ok {
		s.store = &clampWatch{Backend: s.store, ends: map[string]float64{}}
	}
}

func (w *clampWatch) Clamp(ctx context.Context, ks store.KeySet, now, interval, span float64, keepTighter bool) error {
	err := w.Backend.Clamp(ctx, ks, now, interval, span, keepTighter)
	if err == nil {
		w.mu.Lock()
		for i, d := range ks.Dims {
			w.ends[d.Prefix+"\x00"+ks.Keys[i]] = now + span
		}
		w.mu.Unlock()
	}
	return err
}

func (w *clampWatch) Reset(ctx context.Context, ks store.KeySet, now float64) error {
	err := w.Backend.Reset(ctx, ks, now)
	if err == nil {
		w.mu.Lock()
		for i, d := range ks.Dims {
			delete(w.ends, d.Prefix+"\x00"+ks.Keys[i])
		}
		w.mu.Unlock()
	}
	return err
}

// holds reports whether a clamp holds one of ks's keys at now.
func (w *clampWatch) holds(ks store.KeySet, now float64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, d := range ks.Dims {
		if end, ok := w.ends[d.Prefix+"\x00"+ks.Keys[i]]; ok && now < end {
			return true
		}
	}
	return false
}

// checkStatus checks that st, read just before r was reserved at the same
// instant for the same key and cost, predicted it: a grant departs no later
// than Next (earlier only by a hole a cancelled slot left), a refusal
// means Next lies past MaxQueue (at once for the algorithms that never
// queue), and r's Remaining is what a Status would read now.
func checkStatus(t *testing.T, s *Shaper, clock *timer.Fake, st Status, stErr error, r Reservation, err error) {
	t.Helper()
	if stErr != nil { // a cost Status refused, Reserve refuses alike
		if !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("Status refused the cost (%v), Reserve answered %v", stErr, err)
		}
		return
	}
	now := clock.Now()
	wait := st.Next.Sub(now)
	limit := time.Duration(0)
	if s.queues {
		limit = s.cfg.maxQueue
	}
	switch {
	case err == nil && r.Delay > wait:
		t.Fatalf("Status said +%v, the reservation departs at +%v", wait, r.Delay)
	case err == nil && wait > limit && r.Delay == wait:
		t.Fatalf("Status said +%v (past MaxQueue %v), yet the reservation was granted at that wait", wait, limit)
	case errors.Is(err, ErrQueueFull) && wait <= limit:
		t.Fatalf("Status said +%v (within MaxQueue %v), yet the reservation was refused: %v", wait, limit, err)
	}
	if err != nil || len(s.cur.Load().dims) != 1 {
		return
	}
	after, err := s.Status(bg, r.key, r.cost)
	if err != nil {
		t.Fatal(err)
	}
	if after.Binding != "pause" && after.Dimensions[0].Remaining != r.Remaining() {
		t.Fatalf("the reservation reports %d remaining, Status right after it %d", r.Remaining(), after.Dimensions[0].Remaining)
	}
}

// Status consumes nothing, on every store: every scenario of the
// cross-store conformance, run with a Status before each reservation and
// without, gives the same outcome at every step (memory, a Redis node, the
// 3-master cluster).
func TestStatusConsumesNothing(t *testing.T) {
	t.Parallel()
	single, cluster := nodeAndCluster(t)
	stores := []struct {
		name   string
		client redis.UniversalClient
	}{{"memory", nil}, {"redis", single}, {"cluster", cluster}}
	for _, st := range stores {
		for i, sc := range scenarios() {
			run := func(probe bool) []string {
				clock := timer.NewFake(t0)
				prefix := fmt.Sprintf("nothing%d%v:", i, probe)
				var store Store = memstore.New(memstore.WithSweepInterval(0))
				if st.client != nil {
					store = redisstore.New(st.client, redisstore.WithClientClock(), redisstore.WithTimeout(slowMachine))
				}
				s, err := sc.make(store, clock, prefix)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, line := range runScenarioKeys(t, s, clock, uint64(i), oddKeys, nil, probe) {
					if !strings.HasPrefix(line, "status") {
						out = append(out, line)
					}
				}
				return out
			}
			without, with := run(false), run(true)
			for j := range without {
				if with[j] != without[j] {
					t.Fatalf("%s, %s: step %d differs once Status is read before each reservation:\n without: %s\n    with: %s", st.name, sc.name, j, without[j], with[j])
				}
			}
		}
	}
}

// On Redis a Status is one script call that writes nothing: 100 of them run
// 100 EVALSHA and no command but reads inside them.
func TestRedisStatusIsOneReadOnlyCall(t *testing.T) {
	t.Parallel()
	_, c := redisClient(t)
	s, err := All(redisstore.New(c, redisstore.WithTimeout(slowMachine)), []Dimension{
		{Name: "requests", Rate: PerSecond(5), Cost: func(int64) int64 { return 1 }},
		{Name: "tokens", Rate: PerSecond(1000).WithBurst(2000)},
	}, WithPrefix("ro:"), WithContractRefresh(0)) // no contract reads: only Status's calls are counted
	if err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, "k", 700)
	if err := s.Pause(bg, "k", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Status(bg, "k", 1); err != nil { // loads the script
		t.Fatal(err)
	}
	before := commandCalls(t, c)
	for range 100 {
		st, err := s.Status(bg, "k", 100)
		if err != nil {
			t.Fatal(err)
		}
		// Tokens come back at 1 per ms of real time: 1,300 at first, the
		// whole 2,000 only 700 ms later (this loop takes a few ms).
		if rem := st.Dimensions[1].Remaining; st.Binding != "pause" || st.Remaining != 0 || rem < 1299 || rem >= 2000 {
			t.Fatalf("Status of a paused key with 700 of 2,000 tokens used: %+v", st)
		}
	}
	after := commandCalls(t, c)
	for cmd, n := range after {
		switch d := n - before[cmd]; {
		case cmd == "evalsha" && d != 100:
			t.Fatalf("100 Status calls ran %d EVALSHA, want 100", d)
		case d != 0 && cmd != "evalsha" && cmd != "get" && cmd != "time" && cmd != "info":
			t.Fatalf("100 Status calls ran %d %q", d, cmd)
		}
	}
}

var cmdstat = regexp.MustCompile(`cmdstat_([a-z|_]+):calls=(\d+)`)

// commandCalls returns the server's calls per command (INFO commandstats,
// which counts the commands scripts run too).
func commandCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(bg, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, m := range cmdstat.FindAllStringSubmatch(info, -1) {
		out[m[1]], _ = strconv.Atoi(m[2])
	}
	return out
}

// Status validates what it is given as Reserve does, with typed errors.
func TestStatusRefusesBadInput(t *testing.T) {
	t.Parallel()
	s, _, _ := newTest(t, PerSecond(10), WithMaxQueue(time.Second))
	if _, err := s.Status(bg, "k", 0); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("cost 0: %v", err)
	}
	if _, err := s.Status(bg, "k", 100); !errors.Is(err, ErrInvalidCost) {
		t.Fatalf("a cost never admissible within MaxQueue: %v", err)
	}
	if _, err := s.Status(bg, strings.Repeat("x", MaxKeyLen+1), 1); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("a key too long: %v", err)
	}
	var nilShaper *Shaper
	if _, err := nilShaper.Status(bg, "k", 1); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("nil *Shaper: %v", err)
	}
	shapers := map[string]*Shaper{"k": s}
	r := Route(func(key string) Reserver { return shapers[key] }).(interface {
		Status(context.Context, string, int64) (Status, error)
	})
	if st, err := r.Status(bg, "k", 1); err != nil || st.Remaining != 1 {
		t.Fatalf("Route's Status: %+v %v", st, err)
	}
	if _, err := r.Status(bg, "nobody", 1); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("Route to no shaper: %v", err)
	}
}
