package shaper

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// FuzzInFlightRoom drives random histories of Acquire (some cancelled while
// they wait), Reserve, Release (twice, and from copies) and Cancel on two
// keys of a shaper with an in-flight dimension beside a rate, in a synctest
// bubble, and checks after every step: the permits the store counts are
// exactly those of the reservations not yet released, never more than the
// limit; the waiters it counts are the Acquires still waiting; each
// release hands its permit to the oldest waiter of its key; and at the end
// nothing is held and no room is left open.
func FuzzInFlightRoom(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 2, 1, 2, 2, 3, 4, 0, 2})
	f.Add([]byte{0, 8, 0, 9, 0, 10, 1, 2, 2, 2, 5, 2, 6, 3})
	f.Add([]byte{3, 3, 3, 11, 0, 0, 0, 1, 1, 2, 12, 2, 4, 2})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 200 {
			ops = ops[:200]
		}
		synctest.Test(t, func(t *testing.T) { inFlightHistory(t, ops) })
	})
}

type waiting struct {
	key    string
	cancel context.CancelFunc
	got    chan Reservation // a grant, or closed when the Acquire failed; nil once read
	seq    int
	dead   bool // cancelled by the history (it may still have been served first)
}

func inFlightHistory(t *testing.T, ops []byte) {
	const limit = 2
	s := newFlightShaper(t, Dimension{Name: "open", InFlight: limit, MaxWaiting: 3}, Dimension{Name: "rate", Rate: PerSecond(1000).WithBurst(5)})
	keys := []string{"a", "b"}
	held := map[string][]Reservation{}
	var waiters []*waiting
	seq := 0
	settle := func() {
		synctest.Wait()
		// An Acquire that has its permit may still sleep to its rate slot
		// (the burst of 5 spent): let the bubble's time run until each
		// has returned, a millisecond (a slot at 1000/s) at a time.
		for range 100 {
			asleep := 0 // permits taken by Acquires that have not returned
			for _, k := range keys {
				n, _ := inFlight(t, s, k)
				asleep += int(n) - len(held[k])
			}
			for _, w := range waiters {
				asleep -= len(w.got) // returned, not yet read
			}
			if asleep <= 0 {
				break
			}
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		var still []*waiting
		for _, w := range waiters {
			select {
			case r, ok := <-w.got:
				if ok {
					held[w.key] = append(held[w.key], r)
					for _, o := range waiters { // nobody older of its key was still waiting
						if o.key == w.key && o.seq < w.seq && o.got != nil && !o.dead {
							t.Fatalf("waiter %d on %q was served before waiter %d", w.seq, w.key, o.seq)
						}
					}
				}
				w.got = nil
			default:
				still = append(still, w)
			}
		}
		waiters = still
		for _, k := range keys {
			n, wait := inFlight(t, s, k)
			if n != int64(len(held[k])) || n > limit {
				t.Fatalf("key %q: the store holds %d permits, the history %d (limit %d)", k, n, len(held[k]), limit)
			}
			want := 0
			for _, w := range waiters {
				if w.key == k {
					want++
				}
			}
			if wait != want {
				t.Fatalf("key %q: %d waiting, the history has %d", k, wait, want)
			}
		}
	}
	for i, op := range ops {
		k := keys[int(op>>3)%2]
		switch op % 8 {
		case 0, 1: // Acquire, waiting if it must
			ctx, cancel := context.WithCancel(bg)
			w := &waiting{key: k, cancel: cancel, got: make(chan Reservation, 1), seq: seq}
			seq++
			go func() {
				r, err := s.Acquire(ctx, k, 1)
				if err != nil {
					var qf *QueueFullError
					if !errors.Is(err, context.Canceled) && !(errors.As(err, &qf) && qf.InFlight) {
						t.Errorf("Acquire: %v", err)
					}
					close(w.got)
					return
				}
				w.got <- r
			}()
			waiters = append(waiters, w)
		case 2, 3: // release the oldest, and again, and from a copy
			if hs := held[k]; len(hs) > 0 {
				r := hs[0]
				held[k] = hs[1:]
				cp := r
				_ = r.Release(bg)
				_ = cp.Release(bg)
				_ = r.Release(bg)
			}
		case 4: // cancel a waiter
			for _, w := range waiters {
				if w.key == k && !w.dead {
					w.cancel()
					w.dead = true
					break
				}
			}
		case 5: // Reserve: a permit only if one is free and nobody waits
			r, err := s.Reserve(bg, k, 1)
			if err == nil {
				held[k] = append(held[k], r)
			} else if qf := (*QueueFullError)(nil); !errors.As(err, &qf) {
				t.Fatalf("Reserve: %v", err)
			}
		case 6: // Cancel the newest, if its slot has not come: it releases
			if hs := held[k]; len(hs) > 0 {
				r := hs[len(hs)-1]
				if r.Time().After(time.Now()) {
					_ = r.Cancel(bg)
					held[k] = hs[:len(hs)-1]
				}
			}
		case 7:
			time.Sleep(time.Duration(i%5) * time.Millisecond)
		}
		settle()
	}
	for _, w := range waiters {
		w.cancel()
	}
	settle()
	for _, k := range keys {
		for _, r := range held[k] {
			_ = r.Release(bg)
		}
		held[k] = nil
	}
	settle()
	if len(s.flight.rooms) != 0 {
		t.Fatalf("%d rooms left open", len(s.flight.rooms))
	}
}
