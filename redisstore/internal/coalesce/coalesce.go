// Package coalesce is the Redis store's queue of reservations per hash
// slot: which reservation makes its call at once, alone, and which wait to
// go together in the next call, as one batch.
//
// A Lane is one hash slot's queue (every key, on a single node, where a
// script may span slots). A reservation that finds fewer than the lane's
// limit of calls in flight and nobody queued makes its call alone, at
// once, exactly as without coalescing (Join returns true); the ones that
// arrive while the limit is reached queue, and when a call returns
// (Done), its caller sends the queue, up to MaxBatch, as one call, and
// again for those that arrived meanwhile (Next), until the queue is empty.
//
// The limit adapts: NarrowInflight, so that under heavy load reservations
// queue into large batches while the server decides one batch and the
// other's reply travels; or WideInflight once WideAfter batches in a row
// were small (below WideBelow), where queueing would only add a round trip
// to each reservation's wait. One large batch makes the lane narrow again.
// So a lane with a few concurrent callers runs like one call per
// reservation, and one with many coalesces.
//
// The package knows nothing of Redis calls: W is the store's queued
// reservation, which it hands back in order.
package coalesce

import "sync"

const (
	NarrowInflight = 2
	WideInflight   = 8
	WideBelow      = 4
	WideAfter      = 8
)

// MaxBatch is the most reservations one call decides. The replies of a
// call arrive together, after the server has run all of its reservations:
// the cap bounds how late the first of them learns its slot (about 128
// times a reservation's few µs of script), so that slots near now are not
// learnt after they passed, which would bunch their departures.
const MaxBatch = 128

// Lane is one hash slot's queue. The zero Lane is ready to use.
type Lane[W any] struct {
	mu       sync.Mutex
	inflight int  // calls in flight (or about to be), at most its limit
	wide     bool // its batches are small: up to WideInflight calls go at once
	small    int  // consecutive batches below WideBelow
	queue    []W  // the reservations for the next call
	spare    []W  // a sent batch's array, for reuse
}

// limit is how many calls ln may have in flight (ln.mu held).
func (ln *Lane[W]) limit() int {
	if ln.wide {
		return WideInflight
	}
	return NarrowInflight
}

// TryEnter takes a place for a call that goes at once, alone, if the lane
// has room and nobody is queued, and reports whether it did; the caller
// then makes its call and calls Done.
func (ln *Lane[W]) TryEnter() bool {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.enter()
}

func (ln *Lane[W]) enter() bool {
	if ln.inflight < ln.limit() && len(ln.queue) == 0 {
		ln.inflight++
		return true
	}
	return false
}

// Join is TryEnter for w, which otherwise queues for the next batch:
// queued(w) runs first, under the lane's lock, before anyone can take w.
// It reports whether w goes alone.
func (ln *Lane[W]) Join(w W, queued func(W)) bool {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.enter() {
		return true
	}
	queued(w)
	ln.queue = append(ln.queue, w)
	return false
}

// Done ends a call that went alone: it returns the reservations queued
// meanwhile as the next batch, which its caller sends (then Next), or nil
// when none is queued.
func (ln *Lane[W]) Done() []W {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if len(ln.queue) == 0 {
		ln.inflight--
		return nil
	}
	return ln.take()
}

// Next ends the sending of batch, whose array the lane reuses: it returns
// the next batch, or nil when the lane has nothing queued.
func (ln *Lane[W]) Next(batch []W) []W {
	clear(batch)
	ln.mu.Lock()
	defer ln.mu.Unlock()
	ln.spare = batch[:0]
	if len(ln.queue) == 0 {
		ln.inflight--
		return nil
	}
	return ln.take()
}

// take returns the next call's reservations: the queue's first MaxBatch,
// in the order they queued (ln.mu held). The batch's size sets the lane's
// limit of calls in flight.
func (ln *Lane[W]) take() []W {
	if len(ln.queue) < WideBelow {
		ln.small++
		ln.wide = ln.small >= WideAfter
	} else {
		ln.small, ln.wide = 0, false
	}
	if len(ln.queue) <= MaxBatch {
		batch := ln.queue
		ln.queue, ln.spare = ln.spare[:0], nil
		return batch
	}
	batch := append(ln.spare[:0], ln.queue[:MaxBatch]...)
	ln.spare = nil
	n := copy(ln.queue, ln.queue[MaxBatch:])
	clear(ln.queue[n:])
	ln.queue = ln.queue[:n]
	return batch
}

// Lanes maps hash slots to their lanes.
type Lanes[W any] struct {
	one    *Lane[W] // a single node: every key
	bySlot sync.Map // a cluster: uint16 hash slot -> *Lane[W]
}

// Single returns one lane for every key: a single node (or Sentinel),
// where a script may span slots.
func Single[W any]() *Lanes[W] { return &Lanes[W]{one: &Lane[W]{}} }

// PerSlot returns a lane per Redis Cluster hash slot.
func PerSlot[W any]() *Lanes[W] { return &Lanes[W]{} }

// Of returns the lane of the keys whose hash tag is tag, as the keys
// write it.
func (l *Lanes[W]) Of(tag string) *Lane[W] {
	if l.one != nil {
		return l.one
	}
	slot := Slot(tag)
	if v, ok := l.bySlot.Load(slot); ok {
		return v.(*Lane[W])
	}
	v, _ := l.bySlot.LoadOrStore(slot, &Lane[W]{})
	return v.(*Lane[W])
}

// Slot is Redis Cluster's hash slot of a hash tag: CRC16 (XMODEM) modulo
// 16384.
func Slot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
