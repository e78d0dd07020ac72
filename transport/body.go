package transport

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// body is a response body that releases its request's in-flight permit
// (see New) when the call is over: at the first Close, or Read that ends
// the body (io.EOF, or an error: net/http's own bodies are done after one
// too), or WriteTo that reads it to its end, whichever comes first, once.
type body struct {
	rc       io.ReadCloser
	res      *shaper.Reservation
	ctx      context.Context // the request's, without its cancellation
	finish   func()          // the call is over (see Transport.send)
	released atomic.Bool
}

// releasing wraps rc so that it releases res's permit when done. The
// result has the optional interfaces of rc that matter to its readers:
// io.WriterTo (io.Copy), and, on a 101 Switching Protocols response, the
// io.ReadWriteCloser that net/http and httputil.ReverseProxy expect of the
// upgraded connection, with its CloseWrite. It has no others, as
// otelhttp's bodies, so that nothing reads around it.
func releasing(rc io.ReadCloser, res *shaper.Reservation, ctx context.Context, finish func()) io.ReadCloser {
	b := &body{rc: rc, res: res, ctx: context.WithoutCancel(ctx), finish: finish}
	_, wt := rc.(io.WriterTo)
	_, rw := rc.(io.ReadWriteCloser)
	switch {
	case rw && wt:
		return upgradedBodyWriterTo{upgradedBody{b}}
	case rw:
		return upgradedBody{b}
	case wt:
		return bodyWriterTo{b}
	}
	return b
}

func (b *body) release() {
	if b.released.CompareAndSwap(false, true) {
		b.finish()
		_ = b.res.Release(b.ctx) // an error: the store heard nothing; it retries until it does, or the lease expires
	}
}

// Read reads the body; the read that ends it releases the permit.
func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil {
		b.release()
	}
	return n, err
}

// Close closes the body, then releases the permit.
func (b *body) Close() error {
	err := b.rc.Close()
	b.release()
	return err
}

// bodyWriterTo is a body over an io.WriterTo.
type bodyWriterTo struct{ *body }

// WriteTo writes the rest of the body to w; when it returns without an
// error it has read the body to its end, and releases the permit (after an
// error, w's or the body's, Close does).
func (b bodyWriterTo) WriteTo(w io.Writer) (int64, error) {
	n, err := b.rc.(io.WriterTo).WriteTo(w)
	if err == nil {
		b.release()
	}
	return n, err
}

// upgradedBody is the body of a 101 Switching Protocols response: the
// connection, written to as well as read.
type upgradedBody struct{ *body }

// Write writes to the upgraded connection.
func (b upgradedBody) Write(p []byte) (int, error) { return b.rc.(io.Writer).Write(p) }

// CloseWrite half-closes the upgraded connection, as net/http's own body
// of a 101 response does (httputil.ReverseProxy calls it).
func (b upgradedBody) CloseWrite() error {
	if cw, ok := b.rc.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("CloseWrite: %w", http.ErrNotSupported)
}

// upgradedBodyWriterTo is an upgradedBody over an io.WriterTo.
type upgradedBodyWriterTo struct{ upgradedBody }

// WriteTo is bodyWriterTo's.
func (b upgradedBodyWriterTo) WriteTo(w io.Writer) (int64, error) {
	return bodyWriterTo{b.body}.WriteTo(w)
}
