package shaper

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit-go/internal/trace"
)

// TestTraceSeesEveryStoreOperation: each store operation made with a traced
// context is reported once, by name; an untraced context reports nothing.
func TestTraceSeesEveryStoreOperation(t *testing.T) {
	s, _, clock := newTest(t, PerSecond(10))
	var mu sync.Mutex
	var ops []string
	tr := &trace.Hooks{StoreDone: func(_ context.Context, op string, took time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if took < 0 || err != nil {
			t.Errorf("%s: took %v, err %v", op, took, err)
		}
		ops = append(ops, op)
	}}
	ctx := trace.With(context.Background(), tr)
	if trace.From(ctx) != tr || trace.From(context.Background()) != nil {
		t.Fatal("trace.From does not return what trace.With attached")
	}
	if _, err := s.Reserve(context.Background(), "k", 1); err != nil { // untraced
		t.Fatal(err)
	}
	r, err := s.Reserve(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx, "k", time.Second); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait(ctx, "k", 1) }()
	armed(t, clock, 1)
	clock.Advance(2 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Allow(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	want := "[reserve cancel pause reserve pause_left reset reserve]"
	if got := fmt.Sprint(ops); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
