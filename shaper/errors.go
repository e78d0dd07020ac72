package shaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
)

// The sentinels every error of this package matches (errors.Is).
var (
	// ErrQueueFull: the wait would exceed MaxQueue (*QueueFullError).
	ErrQueueFull = errors.New("throttlekit: queue full")
	// ErrInvalidConfig: a configuration refused (*ConfigError, *RateError).
	ErrInvalidConfig = algorithms.ErrInvalidConfig
	// ErrInvalidCost: a cost below 1 or one never admissible (*CostError).
	ErrInvalidCost = algorithms.ErrInvalidCost
	// ErrInvalidKey: a key longer than MaxKeyLen (*KeyError).
	ErrInvalidKey = errors.New("throttlekit: invalid key")
	// ErrStoreUnavailable: Redis failed under FailClosed, or the client is
	// misconfigured (*StoreError).
	ErrStoreUnavailable = errors.New("throttlekit: store unavailable")
	// ErrInvalidState: a key holds data the library did not write
	// (*StateError); that call alone fails and nothing is written.
	ErrInvalidState = errors.New("throttlekit: stored state cannot be used")
	// ErrStoreFull: a memory store at its MaxKeys cap with nothing idle.
	ErrStoreFull = errors.New("throttlekit: memory store is full (MaxKeys) and no key is idle")
)

// ConfigError reports a configuration value that was refused.
type ConfigError = algorithms.ConfigError

// CostError reports a refused cost; nothing was consumed.
type CostError = algorithms.CostError

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 4096

// KeyError reports a refused key (Key holds at most its first 64 bytes).
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

// QueueFullError reports a request refused at once because its wait would
// exceed MaxQueue; nothing was consumed. It matches ErrQueueFull.
type QueueFullError struct {
	Key       string
	Dimension string        // the binding dimension ("pause" for a pause; "" for one contract)
	Delay     time.Duration // the wait the request would have needed
	MaxQueue  time.Duration // the shaper's; 0 for algorithms that never queue
}

// Error says which key, how long the wait would have been, and the limit.
func (e *QueueFullError) Error() string {
	return fmt.Sprintf("throttlekit: key %q would wait %v, more than the maximum queue of %v", e.Key, e.Delay, e.MaxQueue)
}

// Is makes errors.Is(err, ErrQueueFull) true.
func (e *QueueFullError) Is(target error) bool { return target == ErrQueueFull }

// DeadlineError reports a request refused at once because its slot would fall
// after its context's deadline; the slot was given back. It matches
// context.DeadlineExceeded.
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

// StateError reports a key holding data a Redis store did not write (another
// program's value, a corrupt state): that call fails alone, nothing is
// overwritten, and no failure policy serves it. It matches ErrInvalidState.
type StateError struct {
	Op        string // "reserve", "cancel", "settle", "pause"
	Key       string // after the dimension's Key mapping
	Dimension string
	Reason    string
	Err       error // the server's error
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

// StoreError reports Redis failing under FailClosed or, under every policy, a
// client that cannot work as configured (a wrong password, a missing
// permission). It matches ErrStoreUnavailable and unwraps to the cause.
type StoreError struct {
	Op  string // "reserve", "cancel", "settle", "pause", "reset"
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
