package bench

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/redistest"
	"github.com/throttlekit/throttlekit-go/redisstore"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// fair measures what a fair Wait (a flow in its ctx) costs beside a plain
// Wait, in memory and on Redis, at a rate no call reaches (open): the
// figures are the turn's own cost (the key's room, its dispatcher
// goroutine when requests queue, and on Redis the turn's script call), not
// a wait.
// Four flows take turns; 1,000 keys spread the requests, one hot key
// sends them all through one dispatcher.
func (r *report) fair(t *testing.T) {
	flows := make([]context.Context, 4)
	for i := range flows {
		flows[i] = shaper.WithFlow(ctx, shaper.Flow{Name: string(rune('a' + i)), Weight: float64(1 + i)})
	}
	names := keyNames(keys)
	ops := func(s *shaper.Shaper, hot bool) []redisOp {
		key := func(i int) string { return names[i%keys] }
		if hot {
			key = func(int) string { return "hot" }
		}
		return []redisOp{
			{"plain Wait", func(i int) error { return s.Wait(ctx, key(i), 1) }},
			{"fair Wait", func(i int) error { return s.Wait(flows[i%len(flows)], key(i), 1) }},
		}
	}
	r.printf("## Fair turns\n\nA `Wait` whose ctx carries a flow (docs/FAIRNESS.md) beside a plain `Wait`, at a rate no call reaches, so that what is measured is the turn itself: the key's waiting room (a request alone on its key takes its own turn; concurrent ones are handed their slots by the key's dispatcher goroutine), and on Redis the turn's script call before the reservation. Four flows of weights 1 to 4; %d keys, or one hot key through which every request passes one dispatcher. Medians of %d runs of %v each.\n\n", keys, r.sc.runs, r.sc.redisFor)
	r.printf("In memory:\n\n| goroutines | keys | plain Wait req/s | fair Wait req/s | ratio | plain p50 | fair p50 | plain p99 | fair p99 |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	mem := memShaper(t)
	for _, g := range []int{1, 64} {
		for _, hot := range []bool{false, true} {
			var figs [2][3][]float64
			o := ops(mem, hot)
			for run := range r.sc.runs {
				for k := range o {
					k = (k + run) % len(o)
					tp, p50, p99, _ := redisThroughput(t, g, r.sc.redisFor, o[k].op)
					figs[k][0], figs[k][1], figs[k][2] = append(figs[k][0], tp), append(figs[k][1], float64(p50)), append(figs[k][2], float64(p99))
				}
			}
			n := keys
			if hot {
				n = 1
			}
			p, f := figs[0], figs[1]
			r.printf("| %d | %d | %.0f | %.0f | %.2fx | %v | %v | %v | %v |\n", g, n, median(p[0]), median(f[0]), median(f[0])/median(p[0]),
				time.Duration(median(p[1])).Round(100*time.Nanosecond), time.Duration(median(f[1])).Round(100*time.Nanosecond),
				time.Duration(median(p[2])).Round(100*time.Nanosecond), time.Duration(median(f[2])).Round(100*time.Nanosecond))
		}
	}
	srv := redistest.Start(t)
	c := client(srv)
	st := redisstore.New(c)
	t.Cleanup(func() { _ = st.Close() })
	rs, err := shaper.New(st, open, shaper.WithPrefix("fair:"))
	if err != nil {
		t.Fatal(err)
	}
	r.printf("\nOn Redis (the redis-server setup above; a plain Wait's reservation is coalesced, a turn is one script call of its own; Redis calls and server µs per request count every call):\n\n| goroutines | keys | request | requests/s | p50 | p99 | server µs per request | Redis calls per request |\n| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, g := range []int{1, 64} {
		for _, hot := range []bool{false, true} {
			o := ops(rs, hot)
			res := r.redisRuns(t, c, g, o)
			n := keys
			if hot {
				n = 1
			}
			for _, op := range o {
				v := res[op.name]
				r.printf("| %d | %d | %s | %.0f | %v | %v | %.2f | %.2f |\n", g, n, op.name, v.tp,
					time.Duration(v.p50).Round(time.Microsecond), time.Duration(v.p99).Round(time.Microsecond), v.usec, 1/v.perCall)
			}
		}
	}
	r.printf("\n")
}
