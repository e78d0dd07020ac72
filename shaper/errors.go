package shaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
)

var (
	// ErrQueueFull is matched (errors.Is) by every *QueueFullError: the wait a
	// request needs is longer than the shaper accepts.
	ErrQueueFull = errors.New("throttlekit: queue full")

	// ErrInvalidConfig is matched by every configuration error: *ConfigError
	// from New and All, *RateError from ParseRate.
	ErrInvalidConfig = algorithms.ErrInvalidConfig

	// ErrInvalidCost is matched by *CostError: a cost below 1, or one that can
	// never be admitted (above the burst, above the limit, or longer than
	// MaxQueue to drain even on an idle key). Nothing is consumed.
	ErrInvalidCost = algorithms.ErrInvalidCost

	// ErrInvalidKey is matched by *KeyError: a key longer than MaxKeyLen.
	ErrInvalidKey = errors.New("throttlekit: invalid key")

	// ErrStoreUnavailable is matched by every *StoreError: the store (Redis)
	// failed or timed out and the failure policy is FailClosed.
	ErrStoreUnavailable = errors.New("throttlekit: store unavailable")

	// ErrInvalidState is matched by every *StateError: the data stored under
	// one of the library's key names cannot be used (a value of another type,
	// written by other code, or a corrupt state). That call alone fails;
	// nothing is written and no other key is affected.
	ErrInvalidState = errors.New("throttlekit: stored state cannot be used")

	// ErrStoreFull is returned by a memory store at its MaxKeys cap when a new
	// key (or a new pause) arrives and no stored entry is idle. Nothing is
	// written; existing keys are unaffected.
	ErrStoreFull = errors.New("throttlekit: memory store is full (MaxKeys) and no key is idle")
)

// ConfigError reports a configuration value that New or All refused.
type ConfigError = algorithms.ConfigError

// CostError reports a cost that was refused before anything was consumed.
type CostError = algorithms.CostError

// MaxKeyLen is the longest key a shaper accepts, in bytes.
const MaxKeyLen = 4096

// KeyError reports a key that was refused. Key holds at most its first 64 bytes.
type KeyError struct {
	Key    string
	Len    int
	Reason string
}

// Error says what was wrong with the key.
func (e *KeyError) Error() string {
	return fmt.Sprintf("throttlekit: invalid key %q (%d bytes): %s", e.Key, e.Len, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidKey) true.
func (e *KeyError) Unwrap() error { return ErrInvalidKey }

// RateError reports text that ParseRate could not read.
type RateError struct {
	Input  string
	Reason string
}

// Error quotes the input and says what was expected.
func (e *RateError) Error() string {
	return fmt.Sprintf("throttlekit: cannot parse rate %q: %s", e.Input, e.Reason)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) true.
func (e *RateError) Unwrap() error { return ErrInvalidConfig }

// QueueFullError reports a request refused because its wait would exceed the
// shaper's MaxQueue. Nothing was consumed; the caller learns at once instead
// of after waiting. It matches ErrQueueFull.
type QueueFullError struct {
	Key string
	// Dimension names the dimension of a multi-dimension shaper that required
	// the wait ("pause" when a pause did); empty for a single contract.
	Dimension string
	// Delay is the wait the request would have needed.
	Delay time.Duration
	// MaxQueue is the longest wait the shaper grants; zero for algorithms that
	// never queue (everything but the leaky bucket), whose Reserve refuses any
	// request that cannot depart at once.
	MaxQueue time.Duration
}

// Error says which key, how long the wait would have been, and the limit.
func (e *QueueFullError) Error() string {
	return fmt.Sprintf("throttlekit: key %q would wait %v, more than the maximum queue of %v", e.Key, e.Delay, e.MaxQueue)
}

// Is makes errors.Is(err, ErrQueueFull) true.
func (e *QueueFullError) Is(target error) bool { return target == ErrQueueFull }

// DeadlineError reports that Wait refused because the request's departure
// would fall after the context's deadline. Nothing was consumed (the
// reservation was cancelled). It matches context.DeadlineExceeded.
type DeadlineError struct {
	Key      string
	Delay    time.Duration // the wait the request would have needed
	Deadline time.Time     // the context's deadline
}

// Error says which key, the wait it needed and the deadline.
func (e *DeadlineError) Error() string {
	return fmt.Sprintf("throttlekit: key %q would wait %v, past the context deadline %v", e.Key, e.Delay, e.Deadline.Format(time.RFC3339Nano))
}

// Unwrap makes errors.Is(err, context.DeadlineExceeded) true.
func (e *DeadlineError) Unwrap() error { return context.DeadlineExceeded }

// StateError reports a key whose stored data a Redis store could not use: a
// value of another type at the library's key name (written by other code),
// or a state that is not one the library writes. The call fails alone; the
// data is neither read as state nor overwritten, no other key is affected,
// and the failure policy does not serve it (the server is healthy). It
// matches ErrInvalidState and unwraps to the server's error.
type StateError struct {
	Op        string // "reserve", "cancel", "pause"
	Key       string // the caller's key (after the dimension's Key mapping)
	Dimension string // the dimension's name; empty for a shaper of one contract
	Reason    string
	Err       error
}

// Error names the key, the dimension and what was wrong.
func (e *StateError) Error() string {
	dim := ""
	if e.Dimension != "" {
		dim = fmt.Sprintf(" (dimension %q)", e.Dimension)
	}
	return fmt.Sprintf("throttlekit: %s: key %q%s: %s", e.Op, e.Key, dim, e.Reason)
}

// Unwrap returns the server's error.
func (e *StateError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrInvalidState) true.
func (e *StateError) Is(target error) bool { return target == ErrInvalidState }

// StoreError reports a store that failed or timed out under the FailClosed
// policy, or, under every policy, a client that cannot work as configured
// (a wrong password, a missing permission, a closed client). It matches
// ErrStoreUnavailable and unwraps to the cause.
type StoreError struct {
	Op  string // "reserve", "cancel", "pause", "reset"
	Err error
}

// Error says which operation failed and why.
func (e *StoreError) Error() string {
	return fmt.Sprintf("throttlekit: store unavailable (%s): %v", e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *StoreError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStoreUnavailable) true.
func (e *StoreError) Is(target error) bool { return target == ErrStoreUnavailable }
