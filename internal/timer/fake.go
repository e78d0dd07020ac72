package timer

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Fake is a deterministic [Clock] for tests. Its time moves only when the test
// says so. It keeps two clocks, as a real host does: the wall clock returned by
// Now, and the elapsed (monotonic) time on which timers run.
//
//   - [Fake.Advance] moves both and fires every timer that falls due, in order.
//   - [Fake.Jump] moves only the wall clock, forwards or backwards, and fires
//     nothing: this is a host suspend, a VM pause or a clock step.
//
// The zero value is not usable; call [NewFake].
type Fake struct {
	mu      sync.Mutex
	wall    time.Time
	mono    time.Duration
	seq     uint64
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced whenever the pending timers change
}

// NewFake returns a fake clock whose wall clock reads start.
func NewFake(start time.Time) *Fake {
	return &Fake{wall: start.Round(0), changed: make(chan struct{})}
}

// Now returns the fake wall clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wall
}

// NewTimer arms a timer that fires once the fake clock has been advanced by d.
// A timer with d <= 0 fires at once.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, ch: make(chan time.Time, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	if d <= 0 {
		t.ch <- f.wall
		return t
	}
	f.seq++
	t.at, t.seq = f.mono+d, f.seq
	f.timers = append(f.timers, t)
	f.notifyLocked()
	return t
}

// Advance moves the wall clock and the elapsed time forward by d, firing every
// timer that falls due. Timers fire in deadline order, each seeing the wall
// clock at its own deadline. A negative d is treated as zero.
func (f *Fake) Advance(d time.Duration) {
	if d < 0 {
		d = 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	end := f.mono + d
	sort.Slice(f.timers, func(i, j int) bool {
		a, b := f.timers[i], f.timers[j]
		return a.at < b.at || (a.at == b.at && a.seq < b.seq)
	})
	fired := 0
	for _, t := range f.timers {
		if t.at > end {
			break
		}
		f.wall = f.wall.Add(t.at - f.mono)
		f.mono = t.at
		t.ch <- f.wall
		fired++
	}
	f.wall = f.wall.Add(end - f.mono)
	f.mono = end
	if fired > 0 {
		f.timers = append(f.timers[:0], f.timers[fired:]...)
		f.notifyLocked()
	}
}

// Jump steps the wall clock by d (which may be negative) without advancing the
// elapsed time: no timer fires. It simulates a suspend, a VM pause or a clock step.
func (f *Fake) Jump(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wall = f.wall.Add(d)
}

// Pending returns the number of armed timers that have neither fired nor been stopped.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// WaitForTimers blocks until at least n timers are pending, or ctx ends. Tests
// use it to know that a sleeper has armed its timer before they advance time.
func (f *Fake) WaitForTimers(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		pending, changed := len(f.timers), f.changed
		f.mu.Unlock()
		if pending >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

type fakeTimer struct {
	f   *Fake
	ch  chan time.Time
	at  time.Duration
	seq uint64
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	f := t.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, p := range f.timers {
		if p == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			f.notifyLocked()
			return true
		}
	}
	return false
}
