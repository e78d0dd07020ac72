package redisstore

import (
	"sync"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
)

// skew maps the server's timeline (Redis TIME, on which the scripts decide)
// onto the shaper's clock, on which callers sleep to their slots.
//
// A slot the server granted at instant S of its clock must not be left
// before S: on the shaper's clock, before S + θ, where θ is how far the
// shaper's clock runs ahead of the server's. Each call bounds θ: it was
// sent at s and replied to at r on the shaper's clock, and decided at d on
// the server's, so s - d <= θ <= r - d (less what the server ran after
// deciding: took). Anchoring each slot to its own reply (r - d) is never
// early, but a reply read late (a busy pool, a descheduled goroutine) puts
// that slot late and the next one, read on time, close behind it: slot
// instants bunch on the caller's side. So the store keeps one estimate for
// all calls, est >= θ: the tightest upper bound seen, aged by the drift two
// clocks may have (skewDrift) since it was seen. It is never looser than
// the call's own bound (a slot never later than anchoring at its reply
// would put it), and it comes down only when a call finds a tighter bound:
// after the first calls, by no more than the drift allowance accumulated
// since the last such call. A call proving est below θ (s - d > est: the
// server's clock was stepped) starts it over at the call's own bound.
type skew struct {
	mu   sync.Mutex
	base time.Time // the shaper's clock reading that local instants count from
	est  float64   // ms: an upper bound of the shaper's clock (since base) less the server's
	at   float64   // the shaper's clock (ms since base) at the last update
	set  bool
}

// skewDrift is the relative drift between the shaper's clock and the
// server's that est allows for between calls: 100 ppm.
const skewDrift = 1e-4

// observe takes one call's bounds (sent and replied on the shaper's clock,
// decided and took on the server's, all ms) and returns est after it.
func (k *skew) observe(sent, replied, decided, took float64) float64 {
	lo, hi := sent-decided, replied-decided-max(took, 0)
	hi = max(hi, lo) // took cannot make the bound tighter than the send
	k.mu.Lock()
	defer k.mu.Unlock()
	el := max(replied-k.at, 0)
	bound := k.est + skewDrift*el // est aged by the drift: still >= θ
	switch {
	case !k.set || lo > bound: // no estimate yet, or est proved below θ
		k.est = hi
	default:
		k.est = min(bound, hi)
	}
	k.at, k.set = max(k.at, replied), true
	return k.est
}

// remoteDelay returns the delay, counted from replied (the shaper's clock,
// read after the reply), of a slot wait ms after the server's instant
// decided, for a call sent at sent (the shaper's clock) whose server ran
// took ms after deciding: the slot mapped through est, never before the
// reply. A slot at the instant the server decided (wait 0) departs at
// once: the reply comes after it. The server's instants are float64 ms of
// the Unix epoch, whose step is about 0.24 µs; decided + est is exact (two
// numbers of opposite signs within a factor of 2), and one step is added
// for the rounding of est itself.
func (k *skew) remoteDelay(sent, replied time.Time, decided, took, wait float64) float64 {
	k.mu.Lock()
	if k.base.IsZero() {
		k.base = sent
	}
	base := k.base
	k.mu.Unlock()
	s, r := algorithms.DurationMillis(sent.Sub(base)), algorithms.DurationMillis(replied.Sub(base))
	est := k.observe(s, r, decided, took)
	if wait <= 0 {
		return 0
	}
	return max((decided+est)+wait-r+msStep, 0)
}

// msStep is the step of float64 ms from late 2004 to 2039, 2^-12 ms.
const msStep = 1.0 / 4096
