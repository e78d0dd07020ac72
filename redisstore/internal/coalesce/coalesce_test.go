package coalesce

import (
	"slices"
	"sync"
	"testing"
)

// fill queues n new waiters on ln, as Join does when the lane is full.
func fill(ln *Lane[*int], n int) []*int {
	ws := make([]*int, n)
	for i := range ws {
		ws[i] = new(int)
		*ws[i] = i
		ln.queue = append(ln.queue, ws[i])
	}
	return ws
}

// A lane hands out its queue in the order it queued, at most MaxBatch at a
// time, losing and repeating nothing.
func TestALaneTakesInOrderAndCaps(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, MaxBatch - 1, MaxBatch, MaxBatch + 1, 3*MaxBatch + 44} {
		var ln Lane[*int]
		ws := fill(&ln, n)
		var got []*int
		for len(ln.queue) > 0 {
			b := ln.take()
			if len(b) == 0 || len(b) > MaxBatch {
				t.Fatalf("%d queued: a batch of %d", n, len(b))
			}
			got = append(got, b...)
			ln.spare = b[:0]
		}
		if !slices.Equal(got, ws) {
			t.Fatalf("%d queued: taken out of order or lost (%d taken)", n, len(got))
		}
	}
}

// A lane goes wide (more calls in flight, each alone) only after WideAfter
// small batches in a row, and narrow again at the first large one.
func TestALaneWidensOnlyForSmallBatches(t *testing.T) {
	t.Parallel()
	var ln Lane[*int]
	send := func(n int) {
		fill(&ln, n)
		ln.spare = ln.take()[:0]
	}
	for i := range WideAfter {
		if ln.limit() != NarrowInflight {
			t.Fatalf("after %d small batches the limit is %d", i, ln.limit())
		}
		send(WideBelow - 1)
	}
	if ln.limit() != WideInflight {
		t.Fatalf("after %d small batches the limit is %d, want %d", WideAfter, ln.limit(), WideInflight)
	}
	send(WideBelow)
	if ln.limit() != NarrowInflight {
		t.Fatalf("after a batch of %d the limit is %d, want %d", WideBelow, ln.limit(), NarrowInflight)
	}
	send(1)
	if ln.limit() != NarrowInflight {
		t.Fatal("one small batch widened the lane")
	}
}

// The protocol: calls go alone while the lane has room and nobody waits;
// then they queue (queued runs first), and the end of a call hands the
// queue over as one batch, after which the lane is idle again.
func TestJoinDoneNextHandTheQueueOver(t *testing.T) {
	t.Parallel()
	var ln Lane[*int]
	marked := map[*int]bool{}
	mark := func(w *int) { marked[w] = true }
	for i := range NarrowInflight {
		if !ln.Join(&i, mark) {
			t.Fatalf("call %d of %d queued on an idle lane", i, NarrowInflight)
		}
	}
	var waiting []*int
	for i := range 5 {
		w := &i
		if ln.Join(w, mark) {
			t.Fatalf("call %d went alone past the limit", NarrowInflight+i)
		}
		if !marked[w] {
			t.Fatal("a queued call was not readied first")
		}
		waiting = append(waiting, w)
	}
	if ln.TryEnter() {
		t.Fatal("TryEnter found room in a full lane with a queue")
	}
	batch := ln.Done() // the first call returns: it sends the queue
	if !slices.Equal(batch, waiting) {
		t.Fatalf("the end of a call handed over %d, want the %d queued in order", len(batch), len(waiting))
	}
	if next := ln.Next(batch); next != nil {
		t.Fatalf("an empty queue handed over a batch of %d", len(next))
	}
	if ln.Done() != nil { // the second call returns: nothing queued
		t.Fatal("nothing queued, yet a batch")
	}
	for range NarrowInflight {
		if !ln.TryEnter() {
			t.Fatal("an idle lane refused a call")
		}
	}
}

// Joins, Dones and Nexts from many goroutines lose nobody: every waiter
// goes alone or is handed over in exactly one batch.
func TestEveryWaiterGoesOnce(t *testing.T) {
	t.Parallel()
	var ln Lane[*int]
	var mu sync.Mutex
	seen := map[*int]int{}
	see := func(ws ...*int) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range ws {
			seen[w]++
		}
	}
	var senders sync.WaitGroup
	flush := func(b []*int) {
		defer senders.Done()
		for b != nil {
			see(b...)
			b = ln.Next(b)
		}
	}
	const n = 5000
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := new(int)
			*w = i
			if ln.Join(w, func(*int) {}) {
				see(w)
				if b := ln.Done(); b != nil {
					senders.Add(1)
					go flush(b)
				}
			}
		}()
	}
	wg.Wait()
	senders.Wait()
	if len(seen) != n {
		t.Fatalf("%d of %d waiters went", len(seen), n)
	}
	for _, c := range seen {
		if c != 1 {
			t.Fatalf("a waiter went %d times", c)
		}
	}
	if ln.inflight != 0 || len(ln.queue) != 0 {
		t.Fatalf("an idle lane holds %d calls in flight and %d queued", ln.inflight, len(ln.queue))
	}
}

// Slot is the specification's CRC16: its example, and the slots of two
// tags; Of gives a lane per slot, or one lane for every key.
func TestSlotsAndLanes(t *testing.T) {
	t.Parallel()
	if got := Slot("123456789"); got != 0x31C3&16383 {
		t.Fatalf("Slot(123456789) = %d", got)
	}
	per, one := PerSlot[*int](), Single[*int]()
	if per.Of("a") == per.Of("b") || Slot("a") == Slot("b") {
		t.Fatal("two slots, one lane")
	}
	if a := per.Of("a"); per.Of("a") != a || one.Of("a") != one.Of("b") {
		t.Fatal("a slot's lane is not its own")
	}
}
