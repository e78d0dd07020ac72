package store

import "context"

// Learned names one partner key's learned record (package learn's State,
// encoded) and the state keys its clamp holds.
type Learned struct {
	Base string // the shaper's prefix
	Key  string // the caller's key
	KeySet
}

// LearnClamp is the clamp a learned rate sets on the keys (see
// Backend.Clamp): from Now, departures at least Interval ms apart, until
// Now + Span.
type LearnClamp struct {
	Now, Interval, Span float64
	// Tighter leaves a key whose clamp in force spaces departures at
	// least Interval apart: a margin never loosens a partner's clamp.
	Tighter bool
}

// Learning is the part of the store contract that keeps what the shapers
// under a prefix learned of each partner key, fleet-wide.
type Learning interface {
	// Learn reads l's record at now (ms on the shaper's clock). When
	// its version (learn.Version) is want, it writes rec (unless "") to
	// live ttl ms, then sets c (unless nil) on l's keys as Clamp does;
	// otherwise it writes nothing. It returns the record in force after
	// the call ("" when none).
	Learn(ctx context.Context, l *Learned, now float64, want uint64, rec string, ttl float64, c *LearnClamp) (string, error)
}
