// Package partner turns a partner's rate-limit page into a shaper: each of
// its limits is declared as the partner states it and counts it, and New
// derives the schedule that partner never refuses.
//
// A partner counts a limit one of a few ways (its Model):
//
//   - TrailingWindow: the units of the arrivals in the trailing window
//     (OpenAI's requests and tokens per minute).
//   - Window: fixed windows, aligned to the partner's clock or to the
//     first request (GitHub's hourly limit, a daily quota).
//   - Bucket: a token bucket of a capacity refilled at a rate (Anthropic,
//     Stripe; a GCRA with a burst).
//   - NginxLimitReq: nginx's limit_req, which refuses a request that comes
//     too soon after the one before (beyond its burst).
//   - Concurrent: requests open at once.
//
// Declare what the vendor's page says, several limits at once:
//
//	s, err := partner.New(store, []partner.Limit{
//		partner.TrailingWindow("requests", 500, time.Minute).PerRequest(), // 500 RPM
//		partner.TrailingWindow("tokens", 90000, time.Minute),             // 90,000 TPM
//	})
//
// Each call then reserves its cost (an LLM call's input plus max_tokens),
// and settles what it used (transport.WithUsage, or Reservation.Settle):
// a window frees the unused units when they leave it, a bucket refills.
//
// The guarantee (docs/GUARANTEES.md, "The partner's own count"): requests
// that leave when Wait or Acquire returns, and reach the partner within
// the jitter assumed, are never refused by the partner counting its own
// way, in one process or across a fleet on a Redis store; a request that
// would leave later than the lateness allowed takes a new slot instead.
// While demand exceeds the quota the fleet uses all of it but the
// lateness, the jitter and what queued estimates hold (measured figures
// in docs/BENCHMARKS.md). docs/START.md reads the common vendors' pages
// into declarations.
package partner
