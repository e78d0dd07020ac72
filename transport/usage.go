package transport

import (
	"context"
	"io"
	"net/http"
	"sync"

	"github.com/throttlekit/throttlekit-go/shaper"
)

// usageFunc reads a call's usage: the cost it used, and the costs of the
// dimensions that count parts of it apart (nil: none).
type usageFunc func(*http.Response, []byte) (int64, shaper.Costs, bool)

// MaxUsageBody is how much of a response's body WithUsage's function
// sees: the last MaxUsageBody bytes, where a stream reports its usage.
const MaxUsageBody = 1 << 20

// usageBody settles its call's reservation with what usage reads of the
// body, once the body is read to its end or closed.
type usageBody struct {
	rc    io.ReadCloser
	resp  *http.Response
	tk    *ticket
	usage usageFunc
	ctx   context.Context
	once  sync.Once
	mu    sync.Mutex
	buf   []byte
}

// usageOf wraps resp's body to settle tk by usage; an upgraded connection
// (a body that is also a writer) is left as it is.
func usageOf(resp *http.Response, tk *ticket, usage usageFunc, ctx context.Context) io.ReadCloser {
	if resp.Body == nil || resp.Body == http.NoBody {
		return resp.Body
	}
	if _, rw := resp.Body.(io.ReadWriteCloser); rw {
		return resp.Body
	}
	return &usageBody{rc: resp.Body, resp: resp, tk: tk, usage: usage, ctx: context.WithoutCancel(ctx)}
}

func (b *usageBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.mu.Lock()
		b.buf = append(b.buf, p[:n]...)
		if len(b.buf) > 2*MaxUsageBody { // keep the last MaxUsageBody bytes
			b.buf = append(b.buf[:0], b.buf[len(b.buf)-MaxUsageBody:]...)
		}
		b.mu.Unlock()
	}
	if err == io.EOF {
		b.settle()
	}
	return n, err
}

func (b *usageBody) Close() error {
	b.settle()
	return b.rc.Close()
}

// settle reads the usage once and settles the reservation with it.
func (b *usageBody) settle() {
	b.once.Do(func() {
		b.mu.Lock()
		body := b.buf
		if len(body) > MaxUsageBody {
			body = body[len(body)-MaxUsageBody:]
		}
		used, costs, ok := b.usage(b.resp, body)
		b.buf = nil
		b.mu.Unlock()
		if !ok || used < 0 {
			return
		}
		ctx := b.ctx
		if costs != nil {
			ctx = shaper.WithCosts(ctx, costs)
		}
		b.tk.mu.Lock()
		_ = b.tk.r.Settle(ctx, used)
		b.tk.mu.Unlock()
	})
}
