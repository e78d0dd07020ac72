package transport

import (
	"context"
	"errors"
	"net/http"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/throttlekit/throttlekit-go/shaper"
)

// NewRetryableClient returns a go-retryablehttp client whose every attempt,
// retries included, goes through a pacing Transport on r (opts configure it).
// Its backoff honours Retry-After (retryablehttp.DefaultBackoff), and the
// Transport also pauses the key for every process sharing the store.
// Refusals by the shaper (a *shaper.QueueFullError, a *shaper.DeadlineError,
// invalid cost or key) are not retried: waiting longer cannot help. The
// client logs nothing; set its Logger to see attempts.
func NewRetryableClient(r shaper.Reserver, opts ...Option) *retryablehttp.Client {
	c := retryablehttp.NewClient()
	c.Logger = nil
	c.HTTPClient.Transport = New(r, append([]Option{WithBase(c.HTTPClient.Transport)}, opts...)...)
	c.CheckRetry = CheckRetry
	return c
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
