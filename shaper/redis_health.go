package shaper

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// failure is what one failed Redis call says, and so what may answer it.
type failure int

const (
	// failOther fails the call alone: the server answered, or the failure
	// says nothing about its health (a reply this library cannot read).
	failOther failure = iota
	// failData is a key whose stored data cannot be used: a value of another
	// type at the library's key name, or a corrupt state. The call alone
	// fails, with a *StateError naming the key and dimension.
	failData
	// failCost is a cost the script refused (TKCOST): a *CostError.
	failCost
	// failConfig is a client that can never succeed as configured: a wrong
	// password, a missing permission, a closed client. It is returned every
	// time, under every policy, so that a wrong password cannot silently turn
	// the limiter off.
	failConfig
	// failDown is evidence that the server is unreachable or unhealthy:
	// connection refused or reset, LOADING, MASTERDOWN, CLUSTERDOWN, a full
	// database (OOM) and the like. The policy serves the call and the store
	// is judged down.
	failDown
	// failTimeout is a call that held a connection and got no answer within
	// its budget while the server answered nobody at all (errSilent). The
	// policy serves it; the store is judged down if the silence lasted at
	// least half the store's timeout. A call that timed out while the server
	// answered others (errBudget: this process, not the server, is slow) is
	// failOther.
	failTimeout
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

// classify says what err, from a call whose caller is still waiting, means.
func classify(err error) failure {
	var re redis.Error
	if errors.As(err, &re) {
		msg := re.Error()
		switch {
		case strings.HasPrefix(msg, "TKSTATE "), strings.HasPrefix(msg, "WRONGTYPE"):
			return failData
		case strings.HasPrefix(msg, "TKCOST "):
			return failCost
		case hasPrefix(msg, configPrefixes):
			return failConfig
		case hasPrefix(msg, downPrefixes):
			return failDown
		}
		return failOther
	}
	switch {
	case errors.Is(err, errJudgedDown):
		return failDown
	case errors.Is(err, redis.ErrClosed):
		return failConfig
	case errors.Is(err, errSilent):
		return failTimeout
	case errors.Is(err, errBudget):
		return failOther
	case errors.Is(err, context.DeadlineExceeded):
		return failTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return failDown
	}
	var ne net.Error
	if errors.As(err, &ne) {
		if ne.Timeout() {
			return failTimeout
		}
		return failDown
	}
	if strings.Contains(err.Error(), "cluster has no") { // go-redis: no reachable node
		return failDown
	}
	return failOther
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// errBudget is a call that held its connection past its budget while the
// server answered other calls: the server is up, this process is slow.
var errBudget = errors.New("throttlekit: redis answered other calls but not this one within its timeout (is this process overloaded?)")

// errSilent is a call that held its connection past its budget while the
// server answered nobody.
var errSilent = errors.New("throttlekit: redis did not answer within the timeout")

// errJudgedDown answers a call made while Redis is judged down.
var errJudgedDown = errors.New("throttlekit: redis is judged down (it failed less than half a second ago); only a probe goes to it")

// health is the store's view of the server. Up, every call goes to Redis.
// Once a call shows that the server is down (failDown, or a silent
// timeout), it is judged down for redisRetryEvery: calls are served by the
// policy without touching Redis, and callers waiting for a connection are
// released at once. After that one call at a time (the probe) goes to Redis;
// any answer from the server judges it up again.
type health struct {
	downUntil atomic.Int64 // unix ns; 0 while up
	probing   atomic.Bool
	replies   atomic.Uint64 // answers of any kind from the server, counted (no clock read per call)

	mu   sync.Mutex
	wake chan struct{} // closed when the server is judged down

	refusedBy atomic.Pointer[error] // the last refusal of this client's credentials (failConfig), until an answer
}

// refused records err, a refusal of this client's credentials or
// permissions (failConfig).
func (h *health) refused(err error) { h.refusedBy.Store(&err) }

// refusal returns the refusal recorded since the server last answered a
// call, or nil.
func (h *health) refusal() error {
	if p := h.refusedBy.Load(); p != nil {
		return *p
	}
	return nil
}

func newHealth() *health { return &health{wake: make(chan struct{})} }

// admit says whether a call may go to Redis now, and whether it is the
// probe (which must call done).
func (h *health) admit() (try, probe bool) {
	du := h.downUntil.Load()
	if du == 0 {
		return true, false
	}
	if time.Now().UnixNano() < du {
		return false, false
	}
	if h.probing.CompareAndSwap(false, true) {
		return true, true
	}
	return false, false
}

// answered records that the server answered (a result or an error reply):
// it is up.
func (h *health) answered() {
	h.replies.Add(1)
	if h.refusedBy.Load() != nil {
		h.refusedBy.Store(nil)
	}
	if h.downUntil.Load() != 0 {
		h.downUntil.Store(0)
	}
}

// down judges the server down for redisRetryEvery and releases every caller
// waiting for a connection.
func (h *health) down() {
	h.downUntil.Store(time.Now().Add(redisRetryEvery).UnixNano())
	h.mu.Lock()
	close(h.wake)
	h.wake = make(chan struct{})
	h.mu.Unlock()
}

// woken returns the channel closed when the server is next judged down.
func (h *health) woken() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wake
}

// isUp reports whether calls go to Redis (no judgement of down in force).
func (h *health) isUp() bool { return h.downUntil.Load() == 0 }

// silentSince reports whether the server has answered nobody since the
// count of replies was before.
func (h *health) silentSince(before uint64) bool { return h.replies.Load() == before }

// stateError builds the error for a TKSTATE reply: "TKSTATE <dimension
// index> <reason>", naming the user's key and the dimension.
func stateError(op string, err error, dims []*dim, keys []string) error {
	msg := err.Error()
	idx, reason := 0, msg
	if rest, ok := strings.CutPrefix(msg, "TKSTATE "); ok {
		n, why, _ := strings.Cut(rest, " ")
		if i, convErr := strconv.Atoi(n); convErr == nil && i >= 0 && i < len(dims) {
			idx, reason = i, why
		}
	} else if strings.HasPrefix(msg, "WRONGTYPE") {
		reason = "holds a value of another type"
	}
	if len(dims) == 0 {
		return &StateError{Op: op, Reason: reason, Err: err}
	}
	return &StateError{Op: op, Key: keys[idx], Dimension: dims[idx].name, Reason: reason, Err: err}
}
