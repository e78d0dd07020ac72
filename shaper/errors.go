package shaper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/algorithms"
	"github.com/throttlekit/throttlekit-go/internal/store"
)

// The sentinels every error of this package matches (errors.Is).
var (
	// ErrQueueFull: the wait would exceed MaxQueue (*QueueFullError).
	ErrQueueFull = errors.New("throttlekit: queue full")
	// ErrInvalidConfig: a configuration refused (*ConfigError, *RateError).
	ErrInvalidConfig = algorithms.ErrInvalidConfig
	// ErrInvalidCost: a cost below 1 or one never admissible (*CostError).
	ErrInvalidCost = algorithms.ErrInvalidCost
	// ErrSettled: Settle on a Reservation already settled or cancelled.
	ErrSettled = errors.New("throttlekit: reservation already settled or cancelled")
	// ErrInvalidKey: a key longer than MaxKeyLen (*KeyError).
	ErrInvalidKey = errors.New("throttlekit: invalid key")
	// ErrStoreUnavailable: the store could not answer (Redis failed under
	// redisstore.FailClosed, or its client is misconfigured: a
	// *redisstore.Error).
	ErrStoreUnavailable = store.ErrUnavailable
	// ErrInvalidState: a key holds data the library did not write (a
	// *redisstore.StateError); that call alone fails and nothing is written.
	ErrInvalidState = store.ErrInvalidState
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
// exceed MaxQueue, or, when InFlight, because no permit of the in-flight
// dimension was free and the request could not wait for one (Reserve, or
// Acquire with the key's waiting room full: Dimension.MaxWaiting); nothing
// was consumed. It matches ErrQueueFull.
type QueueFullError struct {
	Key       string
	Dimension string        // the binding dimension ("pause" for a pause; "" for one contract)
	Delay     time.Duration // the wait the request would have needed (0 when InFlight: unknown)
	MaxQueue  time.Duration // the shaper's; 0 for algorithms that never queue
	InFlight  bool          // the in-flight dimension bound: every permit was held
}

// Error says which key, how long the wait would have been, and the limit.
func (e *QueueFullError) Error() string {
	if e.InFlight {
		return fmt.Sprintf("throttlekit: key %q: every in-flight permit of dimension %q is held and the request cannot wait for one", e.Key, e.Dimension)
	}
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
