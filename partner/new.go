package partner

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// DefaultLateness is how late after its slot a shaper from New lets a
// request leave unless WithLateness says otherwise: a caller of Wait or
// Acquire that wakes later takes a new slot (see shaper.WithLateness).
const DefaultLateness = 4 * time.Millisecond

// DefaultJitter is how much later than the others a request may reach the
// partner after leaving, unless WithJitter says otherwise: the spread of
// the network's delay, and of the partner's own reading of its clock.
const DefaultJitter = time.Millisecond

// DefaultSpacingJitter is the jitter assumed for a limit that refuses on
// spacing (NginxLimitReq), unless WithJitter says otherwise: such a
// partner refuses a request that comes a millisecond too close, and the
// path from a departure to its clock (the HTTP client, a new connection's
// dial, the network, its event loop) varies by a few milliseconds on a
// loaded host, and a fleet's processes each map the store's clock onto
// their own, a few milliseconds apart under load.
const DefaultSpacingJitter = 10 * time.Millisecond

// Option configures New.
type Option func(*options)

type options struct {
	lateness, jitter time.Duration
	jitterSet        bool
	shaper           []shaper.Option
	err              error
}

// WithLateness sets how late after its slot a request may leave (default
// DefaultLateness; at least a millisecond): the schedule allows for it,
// and Wait and Acquire give a later wake-up a new slot.
func WithLateness(d time.Duration) Option {
	return func(o *options) {
		if d < time.Millisecond {
			o.err = &shaper.ConfigError{Algorithm: "partner", Field: "Lateness", Value: d, Reason: "must be at least 1ms"}
		}
		o.lateness = d
	}
}

// WithJitter sets the spread of the delay between a request's departure and
// its arrival as the partner counts it (default DefaultJitter, and
// DefaultSpacingJitter when a limit refuses on spacing; 0 or more): the
// HTTP client's and the network's jitter, a proxy's queue, the partner's
// clock resolution.
func WithJitter(d time.Duration) Option {
	return func(o *options) {
		if d < 0 {
			o.err = &shaper.ConfigError{Algorithm: "partner", Field: "Jitter", Value: d, Reason: "must be >= 0"}
		}
		o.jitter, o.jitterSet = d, true
	}
}

// WithShaper passes options to the shaper New builds (a name, a clock,
// MaxQueue, learning).
func WithShaper(opts ...shaper.Option) Option {
	return func(o *options) { o.shaper = append(o.shaper, opts...) }
}

// New returns a shaper that keeps every limit of a partner at once, as the
// partner counts each (see Limit), so that the partner refuses none of the
// requests it lets go while their arrivals stay within the lateness and
// jitter assumed, and uses the whole of the tightest limit otherwise. An
// OpenAI-style API with 500 requests and 90,000 tokens per minute, a
// call's cost its tokens:
//
//	s, err := partner.New(store, []partner.Limit{
//		partner.TrailingWindow("requests", 500, time.Minute).PerRequest(),
//		partner.TrailingWindow("tokens", 90000, time.Minute),
//	})
//
// Limits are checked before anything is built: an invalid one is a
// *LimitError, which matches ErrInvalidLimit and shaper.ErrInvalidConfig.
func New(store shaper.Store, limits []Limit, opts ...Option) (*shaper.Shaper, error) {
	o := options{lateness: DefaultLateness, jitter: DefaultJitter}
	for _, f := range opts {
		f(&o)
	}
	if o.err != nil {
		return nil, o.err
	}
	if !o.jitterSet {
		for _, l := range limits {
			if l.Model == LimitReq {
				o.jitter = max(o.jitter, DefaultSpacingJitter)
			}
		}
	}
	dims, err := Dimensions(limits, o.lateness+o.jitter)
	if err != nil {
		return nil, err
	}
	base := []shaper.Option{shaper.WithLateness(o.lateness)}
	if h := horizon(limits); h > 0 {
		base = append(base, shaper.WithHorizon(h))
	}
	return shaper.All(store, dims, append(base, o.shaper...)...)
}

// horizon is how far ahead a process takes slots for limits of a call's
// cost (see shaper.WithHorizon): a hundredth of the shortest such window
// (or refill time), at most a second, at least a millisecond; 0 when every
// limit counts requests. A slot granted ahead holds its call's estimate in
// the window until the call settles for what it used: a fleet of N
// processes holds about N hundredths of the window so, and if calls use
// two thirds of their estimates, that costs the window N/300 of its quota.
func horizon(limits []Limit) time.Duration {
	h := time.Duration(0)
	for _, l := range limits {
		if l.Requests {
			continue
		}
		var span time.Duration
		switch l.Model {
		case Trailing, FixedWindow:
			span = l.Window
		case TokenBucket:
			if l.Refill.Count > 0 && l.Quota > 0 {
				span = time.Duration(float64(l.Refill.Period) * float64(l.Quota) / float64(l.Refill.Count))
			}
		}
		if span > 0 {
			d := min(max(span/100, time.Millisecond), time.Second)
			if h == 0 || d < h {
				h = d
			}
		}
	}
	return h
}

// instant is what the stores' instants may be off by: they are float64
// milliseconds since 1970, exact to about a quarter of a microsecond.
const instant = time.Microsecond

// Dimensions returns the shaper dimensions that keep limits when each
// request reaches the partner up to spread later than its slot (lateness
// plus jitter), for a caller that builds the shaper itself: give it
// shaper.WithLateness(lateness), so that the lateness assumed is enforced,
// and for limits of a call's cost shaper.WithHorizon, as New does.
func Dimensions(limits []Limit, spread time.Duration) ([]shaper.Dimension, error) {
	if len(limits) == 0 {
		return nil, &LimitError{Field: "Limits", Reason: "none given: declare at least one"}
	}
	if spread < 0 {
		return nil, &LimitError{Field: "spread", Reason: fmt.Sprintf("%v: must be >= 0", spread)}
	}
	spread += instant
	seen := make(map[string]bool, len(limits))
	dims := make([]shaper.Dimension, 0, len(limits))
	for _, l := range limits {
		if seen[l.Name] {
			return nil, &LimitError{Limit: l, Field: "Name", Reason: "is declared twice"}
		}
		seen[l.Name] = true
		d, err := l.dimension(spread)
		if err != nil {
			return nil, err
		}
		dims = append(dims, d)
	}
	return dims, nil
}
