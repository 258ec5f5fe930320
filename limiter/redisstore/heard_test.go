package redisstore

import "sync"

// heard collects what a callback heard (a Listen's names, a ServerClock's
// switches), safe to add to from the goroutine that calls it.
type heard[T any] struct {
	mu    sync.Mutex
	items []T
}

func (h *heard[T]) add(v T) {
	h.mu.Lock()
	h.items = append(h.items, v)
	h.mu.Unlock()
}

func (h *heard[T]) got() []T {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]T(nil), h.items...)
}
