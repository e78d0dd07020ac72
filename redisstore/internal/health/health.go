// Package health is the Redis store's view of its server: whether a call
// may go to Redis now (or only a probe), what a failed call says of the
// server (Classify), and when a silent server is judged down.
package health

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Failure is what one failed Redis call says, and so what may answer it.
type Failure int

const (
	// Other fails the call alone: the server answered, or the failure
	// says nothing about its health (a reply this library cannot read).
	Other Failure = iota
	// Data is a key whose stored data cannot be used: a value of another
	// type at the library's key name, or a corrupt state. The call alone
	// fails, with a *StateError naming the key and dimension.
	Data
	// Cost is a cost the script refused (TKCOST): a *CostError.
	Cost
	// Config is a client that can never succeed as configured: a wrong
	// password, a missing permission, a closed client. It is returned every
	// time, under every policy, so that a wrong password cannot silently turn
	// the limiter off.
	Config
	// Down is evidence that the server is unreachable or unhealthy:
	// connection refused or reset, LOADING, MASTERDOWN, CLUSTERDOWN, a full
	// database (OOM) and the like. The policy serves the call and the store
	// is judged down.
	Down
	// Timeout is a call that held a connection and got no answer within
	// its budget while the server answered nobody at all (ErrSilent). The
	// policy serves it; the store is judged down if the silence lasted at
	// least half the store's timeout. A call that timed out while the server
	// answered others (ErrBudget: this process, not the server, is slow) is
	// Other.
	Timeout
)

// Redis error prefixes that report an unhealthy server rather than a bad
// request. A script's redis.call errors carry the same prefixes (Redis 7).
var downPrefixes = []string{
	"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "READONLY",
	"OOM", "MISCONF", "NOREPLICAS", "NOQUORUM", "ERR max number of clients",
}

// configPrefixes report a client that is misconfigured for this server.
// "ERR Protocol error: unauthenticated" is how a server that wants a
// password answers a command with more than a few arguments before AUTH.
var configPrefixes = []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR unknown command", "ERR AUTH", "ERR Protocol error: unauthenticated"}

// Classify says what err, from a call whose caller is still waiting, means.
func Classify(err error) Failure {
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		switch {
		case strings.HasPrefix(msg, "TKSTATE "), strings.HasPrefix(msg, "WRONGTYPE"):
			return Data
		case strings.HasPrefix(msg, "TKCOST "):
			return Cost
		case hasPrefix(msg, configPrefixes):
			return Config
		case hasPrefix(msg, downPrefixes):
			return Down
		}
		return Other
	}
	switch {
	case errors.Is(err, ErrJudgedDown):
		return Down
	case errors.Is(err, redis.ErrClosed):
		return Config
	case errors.Is(err, ErrSilent):
		return Timeout
	case errors.Is(err, ErrBudget):
		return Other
	case errors.Is(err, context.DeadlineExceeded):
		return Timeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return Down
	}
	var ne net.Error
	if errors.As(err, &ne) {
		if ne.Timeout() {
			return Timeout
		}
		return Down
	}
	if strings.Contains(err.Error(), "cluster has no") { // go-redis: no reachable node
		return Down
	}
	return Other
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// ErrBudget is a call that held its connection past its budget while the
// server answered other calls: the server is up, this process is slow.
var ErrBudget = errors.New("throttlekit: redis answered other calls but not this one within its timeout (is this process overloaded?)")

// ErrSilent is a call that held its connection past its budget while the
// server answered nobody.
var ErrSilent = errors.New("throttlekit: redis did not answer within the timeout")

// ErrJudgedDown answers a call made while Redis is judged down.
var ErrJudgedDown = errors.New("throttlekit: redis is judged down (it failed less than half a second ago); only a probe goes to it")

// RetryEvery is how long a server judged down is served by the failure
// policy before one call (the probe) tries it again.
const RetryEvery = 500 * time.Millisecond

// Tracker is the store's view of the server. Up, every call goes to Redis.
// Once a call shows that the server is down (Down, or a silent timeout),
// it is judged down for RetryEvery: calls are served by the policy without
// touching Redis, and callers waiting for a connection are released at
// once. After that one call at a time (the probe) goes to Redis; any
// answer from the server judges it up again.
type Tracker struct {
	timeout   time.Duration // the store's per-call timeout
	downUntil atomic.Int64  // unix ns; 0 while up
	probing   atomic.Bool
	replies   atomic.Uint64 // answers of any kind from the server, counted (no clock read per call)

	mu   sync.Mutex
	wake chan struct{} // closed when the server is judged down

	refusedBy atomic.Pointer[error] // the last refusal of this client's credentials (Config), until an answer
}

// New returns the tracker of a store whose calls time out after timeout.
func New(timeout time.Duration) *Tracker {
	return &Tracker{timeout: timeout, wake: make(chan struct{})}
}

// Pass is a call's admission: whether it may go to Redis, and whether it
// is the probe of a server judged down (which Done ends).
type Pass struct{ Try, Probe bool }

// Admit says whether a call may go to Redis now; the caller ends it with
// Done, whatever it did.
func (h *Tracker) Admit() Pass {
	du := h.downUntil.Load()
	if du == 0 {
		return Pass{Try: true}
	}
	if time.Now().UnixNano() < du {
		return Pass{}
	}
	if h.probing.CompareAndSwap(false, true) {
		return Pass{Try: true, Probe: true}
	}
	return Pass{}
}

// Done ends a call Admit admitted: a probe lets the next one go.
func (h *Tracker) Done(p Pass) {
	if p.Probe {
		h.probing.Store(false)
	}
}

// Replies returns the count of the server's answers so far.
func (h *Tracker) Replies() uint64 { return h.replies.Load() }

// Refused records err, a refusal of this client's credentials or
// permissions (Config).
func (h *Tracker) Refused(err error) { h.refusedBy.Store(&err) }

// Refusal returns the refusal recorded since the server last answered a
// call, or nil.
func (h *Tracker) Refusal() error {
	if p := h.refusedBy.Load(); p != nil {
		return *p
	}
	return nil
}

// Answered records that the server answered (a result or an error reply):
// it is up.
func (h *Tracker) Answered() {
	h.replies.Add(1)
	if h.refusedBy.Load() != nil {
		h.refusedBy.Store(nil)
	}
	if h.downUntil.Load() != 0 {
		h.downUntil.Store(0)
	}
}

// Down judges the server down for RetryEvery and releases every caller
// waiting for a connection.
func (h *Tracker) Down() {
	h.downUntil.Store(time.Now().Add(RetryEvery).UnixNano())
	h.mu.Lock()
	close(h.wake)
	h.wake = make(chan struct{})
	h.mu.Unlock()
}

// Woken returns the channel closed when the server is next judged down.
func (h *Tracker) Woken() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wake
}

// IsUp reports whether calls go to Redis (no judgement of down in force).
func (h *Tracker) IsUp() bool { return h.downUntil.Load() == 0 }

// SilentSince reports whether the server has answered nobody since the
// count of replies was before.
func (h *Tracker) SilentSince(before uint64) bool { return h.replies.Load() == before }

// TimedOut judges a call that waited for waited and ran out of time, the
// server's replies having been counted at replies when it began. If the
// server answered other calls meanwhile it is up and this process is slow
// (ErrBudget: the call fails alone). If it answered nobody (ErrSilent) the
// policy serves the call, and the server is judged down when the silence
// lasted at least half the timeout, or at once when the call was the probe
// of a server already judged down.
func (h *Tracker) TimedOut(replies uint64, waited time.Duration, probe bool) error {
	if !h.SilentSince(replies) {
		return ErrBudget
	}
	if probe || waited >= h.timeout/2 {
		h.Down()
	}
	return ErrSilent
}
