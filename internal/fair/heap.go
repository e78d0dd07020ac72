package fair

// heap is an indexed binary min-heap: Min, Push, Remove and Fix in
// O(log n), each item knowing its position (pos), so that a flow can be
// taken out of the middle. It orders as a Redis sorted set orders the
// same members (see the less functions in fair.go).
type heap[T any] struct {
	items []T
	less  func(a, b T) bool
	pos   func(T) *int // the item's index in items; -1 when out
}

func (h *heap[T]) Len() int { return len(h.items) }

// Min returns the least item; ok is false when the heap is empty.
func (h *heap[T]) Min() (x T, ok bool) {
	if len(h.items) == 0 {
		return x, false
	}
	return h.items[0], true
}

// Has reports whether x is in h.
func (h *heap[T]) Has(x T) bool {
	i := *h.pos(x)
	return i >= 0 && i < len(h.items) && any(h.items[i]) == any(x)
}

// Push adds x (which must be out of h).
func (h *heap[T]) Push(x T) {
	*h.pos(x) = len(h.items)
	h.items = append(h.items, x)
	h.up(len(h.items) - 1)
}

// Remove takes x out of h, if it is in.
func (h *heap[T]) Remove(x T) {
	if !h.Has(x) {
		return
	}
	i := *h.pos(x)
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	var zero T
	h.items[last] = zero
	h.items = h.items[:last]
	*h.pos(x) = -1
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
}

// Fix restores the order after x's key changed (x in h).
func (h *heap[T]) Fix(x T) {
	i := *h.pos(x)
	if !h.down(i) {
		h.up(i)
	}
}

func (h *heap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.pos(h.items[i]) = i
	*h.pos(h.items[j]) = j
}

func (h *heap[T]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(h.items[j], h.items[i]) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h *heap[T]) down(i0 int) bool {
	i, n := i0, len(h.items)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && h.less(h.items[r], h.items[j]) {
			j = r
		}
		if !h.less(h.items[j], h.items[i]) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
