// Package partnertest runs an in-process HTTP partner for tests: an
// httptest.Server that limits every request it gets with a token bucket of
// its own, which nobody here tunes against, and whose rate a test can
// change, or pause altogether, while it runs.
//
// The bucket holds up to Options.Burst tokens and refills continuously at
// the partner's rate; it starts full. A request that finds a token takes it
// and gets 200, any other gets 429 (with Retry-After when
// Options.RetryAfter is set). With Options.Policy every response also
// states the limit in the IETF fields of
// draft-ietf-httpapi-ratelimit-headers-10:
//
//	RateLimit-Policy: "default";q=10;w=1
//	RateLimit: "default";r=4;t=0
//
// Partner.Log records every request's arrival and status.
package partnertest
