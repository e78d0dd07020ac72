package shaper

import (
	"context"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/trace"
)

// storeTimer starts timing one store operation for ctx's trace; done is a
// no-op when ctx carries none.
type storeTimer struct {
	ctx   context.Context
	t     *trace.Hooks
	start time.Time
}

func startStore(ctx context.Context) storeTimer {
	t := trace.From(ctx)
	if t == nil || t.StoreDone == nil {
		return storeTimer{}
	}
	return storeTimer{ctx: ctx, t: t, start: time.Now()}
}

func (st storeTimer) done(op string, err error) {
	if st.t != nil {
		st.t.StoreDone(st.ctx, op, time.Since(st.start), err)
	}
}
