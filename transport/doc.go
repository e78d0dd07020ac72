// Package transport paces outbound HTTP: an http.RoundTripper that reserves a
// departure slot on a shaper.Reserver before every request, so that a client's
// traffic reaches the partner as a steady stream inside its contract.
//
//	s, _ := shaper.New(store, shaper.PerSecond(10))
//	client := &http.Client{Transport: transport.New(s)}
//
// By default requests are keyed by host and cost 1 (WithKey, WithCost). A
// request whose departure would fall after its context's deadline is not sent:
// it fails at once with an error matching context.DeadlineExceeded and its slot
// is given back. Every response is the partner's feedback (Feedback, given
// to shaper.Shaper.Learn; WithFeedback): a refusal with Retry-After (a
// 429, a 503, GitHub's 403), or rate-limit headers saying nothing is
// left, pause the key, for every
// process sharing the store; headers saying few requests are left clamp it;
// a shaper made with shaper.WithLearning learns the key's rate from them
// (docs/LEARNING.md). ParseLimits reads every rate-limit header dialect:
// the IETF draft's RateLimit-Policy and RateLimit, the older RateLimit-*
// forms, X-RateLimit-* and GitHub's, OpenAI's and Anthropic's. On a strict
// contract (burst 1) the transport keeps a margin between departures, for
// a partner that measures their spacing strictly (WithSpacingMargin,
// DefaultSpacingMargin). NewRetryableClient composes all of this with
// hashicorp/go-retryablehttp.
//
// On a shaper with an in-flight dimension (shaper.Dimension.InFlight) a
// request also waits for one of its key's permits, and holds it until its
// response body is closed or read to its end, or the round trip fails: at
// most InFlight calls of a key are open at once, fleet-wide on a shared
// store. Close every response body (see New).
//
// A request whose ctx carries a flow (shaper.WithFlow), or that WithFlow
// names from the request, waits for its flow's turn among the requests
// waiting on its key instead of arrival order (docs/FAIRNESS.md).
package transport
