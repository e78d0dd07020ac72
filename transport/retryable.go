package transport

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// NewRetryableClient returns a go-retryablehttp client whose every attempt,
// retries included, goes through a pacing Transport on r (opts configure it).
// Its backoff honours Retry-After, capped at the client's RetryWaitMax and at
// the Transport's MaxPause (see Backoff), and the Transport also pauses the
// key for every process sharing the store. Refusals by the shaper (a
// *shaper.QueueFullError, a *shaper.DeadlineError, invalid cost or key) are
// not retried: waiting longer cannot help. The client logs nothing; set its
// Logger to see attempts.
func NewRetryableClient(r shaper.Reserver, opts ...Option) *retryablehttp.Client {
	c := retryablehttp.NewClient()
	c.Logger = nil
	t := New(r, append([]Option{WithBase(c.HTTPClient.Transport)}, opts...)...)
	c.HTTPClient.Transport = t
	c.CheckRetry = CheckRetry
	c.Backoff = Backoff(t.maxPause)
	return c
}

// Backoff returns a retryablehttp.Backoff that waits what a 429 or 503's
// Retry-After asks, capped at maxPause and at the client's RetryWaitMax (a
// partner cannot hold a caller for years with "Retry-After: 999999999"), and
// otherwise backs off exponentially as retryablehttp.DefaultBackoff does.
func Backoff(maxPause time.Duration) retryablehttp.Backoff {
	return func(lo, hi time.Duration, attempt int, resp *http.Response) time.Duration {
		if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
			if d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
				return min(d, maxPause, hi)
			}
		}
		return retryablehttp.DefaultBackoff(lo, hi, attempt, nil)
	}
}

// CheckRetry is retryablehttp.DefaultRetryPolicy, except that the shaper's
// own refusals are final.
func CheckRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if errors.Is(err, shaper.ErrQueueFull) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, shaper.ErrInvalidCost) || errors.Is(err, shaper.ErrInvalidKey) {
		return false, err
	}
	return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
}
