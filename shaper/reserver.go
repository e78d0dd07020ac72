package shaper

import (
	"context"
	"time"
)

// Reserver is what the transport, the queue and otelshaper.Wrap accept: a
// *Shaper, or anything that decorates one (Route, otelshaper.Wrap).
type Reserver interface {
	Reserve(ctx context.Context, key string, cost int64) (Reservation, error)
	Wait(ctx context.Context, key string, cost int64) error
	Pause(ctx context.Context, key string, d time.Duration) error
}

// The optional capabilities of a Reserver: a *Shaper has each, and Route's
// and otelshaper's Reservers forward each to the Reserver they wrap. Code
// that accepts a Reserver checks for them with a type assertion, as
// net/http checks a ResponseWriter for http.Flusher.
type (
	// Acquirer is a Reserver whose Wait returns the reservation the request
	// departs on, to settle (Shaper.Acquire). A forwarder returns the zero
	// Reservation when the Reserver it wraps has none.
	Acquirer interface {
		Acquire(ctx context.Context, key string, cost int64) (Reservation, error)
	}
	// StatusReader reports a key's standing without consuming (Shaper.Status).
	StatusReader interface {
		Status(ctx context.Context, key string, cost int64) (Status, error)
	}
	// Clamper paces a key evenly until a partner's reset (Shaper.Clamp).
	Clamper interface {
		Clamp(ctx context.Context, key string, remaining int64, reset time.Duration) error
	}
	// PermitHolder tells whether a key's reservations hold an in-flight
	// permit (Shaper.HoldsPermits): its caller acquires with Acquire
	// instead of Wait and releases when the call ends.
	PermitHolder interface {
		HoldsPermits(key string) bool
	}
	// TurnTaker is a Reserver that can wait for a flow's turn without
	// sleeping until the slot (Shaper.AwaitTurn): a scheduler holds the
	// request meanwhile.
	TurnTaker interface {
		AwaitTurn(ctx context.Context, key string, cost int64) (Reservation, error)
	}
)

var (
	_ Acquirer     = (*Shaper)(nil)
	_ TurnTaker    = (*Shaper)(nil)
	_ StatusReader = (*Shaper)(nil)
	_ Clamper      = (*Shaper)(nil)
	_ PermitHolder = (*Shaper)(nil)
	_ Reserver     = (*Shaper)(nil)
)
