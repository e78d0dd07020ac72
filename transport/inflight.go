package transport

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// DefaultAbandonGrace is how long, at most, a request whose caller gave up
// before the partner answered keeps its in-flight permit, unless
// WithAbandonGrace says otherwise (see New).
const DefaultAbandonGrace = 30 * time.Second

// WithAbandonGrace sets how long, at most, a request holding an in-flight
// permit (see New) keeps it after its caller gave up before the partner
// answered (its ctx ended: a client timeout, a cancel): the partner may
// still be serving the abandoned request, and a partner that counts its
// open requests counts that one too. The call goes on without its caller
// until the partner answers (its response is then read to its end and
// discarded: the partner is done with it) or d has passed (the call is then
// cut, its connection closed), and only then is the permit released.
// Default DefaultAbandonGrace: partners commonly cut a request at 30 s (load
// balancers and API gateways do), so a permit outlives a partner that is
// working on the request, and is held that long only by a partner that never
// answers. Set the longest the partner may work on a request; 0 releases at
// once when the caller gives up, for a partner known to stop the work when
// the client goes.
func WithAbandonGrace(d time.Duration) Option {
	return func(t *Transport) { t.abandon = max(d, 0) }
}

// send sends req through the base transport. A request that holds res's
// in-flight permit (holding) is sent on a ctx detached from its caller's
// cancellation: if the caller's ctx ends before the response headers come,
// send returns the ctx's error at once, as net/http does, and the call goes
// on in the background, holding the permit, until the partner answers (the
// body is then drained) or the abandon grace ends (the call is then cut);
// handed is set: the background releases. Once the headers have come, the
// caller's ctx governs the call again (its end cuts the body's reads, as
// net/http does; the read error releases the permit: the partner has
// answered). finish, called when the call is over (the body done, see
// releasing), lets go of the detached ctx.
func (t *Transport) send(req *http.Request, holding bool, res *shaper.Reservation, handed *bool) (resp *http.Response, finish func(), err error) {
	if !holding || t.abandon <= 0 {
		resp, err = t.baseRT().RoundTrip(req)
		return resp, func() {}, err
	}
	ctx := req.Context()
	callCtx, cut := context.WithCancel(context.WithoutCancel(ctx))
	call := req.WithContext(callCtx)
	// http.Client's Timeout, over a RoundTripper it does not know, also
	// closes Request.Cancel: the caller gives up that way too.
	//lint:ignore SA1019 http.Client still sets it for RoundTrippers it does not know
	gaveUp := req.Cancel
	//lint:ignore SA1019 the call is detached from it as from ctx
	call.Cancel = nil
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := t.baseRT().RoundTrip(call)
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			cut()
			return r.resp, func() {}, r.err
		}
		r.resp.Request = req
		stop := context.AfterFunc(ctx, cut)
		stopCancel := func() bool { return false }
		if gaveUp != nil { // the body's reads end with it too
			stopped := make(chan struct{})
			go func() {
				select {
				case <-gaveUp:
					cut()
				case <-stopped:
				}
			}()
			stopCancel = sync.OnceValue(func() bool { close(stopped); return true })
		}
		return r.resp, func() { stop(); stopCancel(); cut() }, nil
	case <-ctx.Done():
	case <-gaveUp:
	}
	*handed = true
	bg := context.WithoutCancel(ctx)
	go func() {
		defer func() { _ = res.Release(bg) }()
		defer cut()
		grace := time.AfterFunc(t.abandon, cut) // past it, the call is cut: its connection closes
		defer grace.Stop()
		if r := <-done; r.err == nil && r.resp.Body != nil {
			_, _ = io.Copy(io.Discard, r.resp.Body) // to its end: the partner is done with it
			_ = r.resp.Body.Close()
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return nil, nil, errCanceled
}

// errCanceled is RoundTrip's error for a request whose Request.Cancel
// closed (net/http's own reads the same).
var errCanceled = errors.New("net/http: request canceled")
