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
	// Tighter leaves a key whose clamp in force spaces departures
	// further than Interval apart: a margin never loosens a partner's
	// clamp (and renews its own).
	Tighter bool
}

// TallyWidth is the width of a Tally's bucket, in ms.
const TallyWidth = 250.0

// TallyLife is how long a key's tallies live after their last write, in
// ms: the buckets older than it are dropped.
const TallyLife = 3000.0

// Tally counts the partner's answers to the requests of a key that
// departed in one bucket: the TallyWidth ms from Bucket*TallyWidth.
type Tally struct {
	Bucket   int64
	Accepted int64
	Answered int64
}

// LearnOp is one call of Learning.Learn: a record to compare and write,
// a clamp to set, this process's tallies to add and the fleet's to read.
type LearnOp struct {
	Now   float64     // ms on the shaper's clock
	Want  uint64      // the version the caller read (learn.Version): a mismatch writes nothing but the tallies
	Rec   string      // the record to write ("" none)
	TTL   float64     // its life, ms
	Clamp *LearnClamp // the clamp to set with it (nil none)
	Add   []Tally     // this process's answers since its last call
	From  int64       // read the fleet's tallies of the buckets from this one on (0: none)
	// Reset forgets the keys' schedules (Backend.Reset) but not their
	// clamps and pauses (a partner's pause holds across it), then sets
	// Clamp (which it needs): when the version is Want, in the same call,
	// so that no reservation sees the keys reset without the learned clamp.
	Reset bool
}

// Learning is the part of the store contract that keeps what the shapers
// under a prefix learned of each partner key, fleet-wide.
type Learning interface {
	// Learn adds op.Add to l's tallies, then reads l's record. When its
	// version (learn.Version) is op.Want, it writes op.Rec (unless ""),
	// resets l's keys but their clamps when op.Reset, and sets op.Clamp
	// (unless nil) on l's keys as Clamp does. It
	// returns the record in force after the call ("" when none) and,
	// when op.From > 0, the fleet's tallies of the buckets from op.From,
	// in bucket order.
	Learn(ctx context.Context, l *Learned, op *LearnOp) (string, []Tally, error)
}
