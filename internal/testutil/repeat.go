package testutil

import "sync"

// Repeat runs f over and over on each of n goroutines, until f returns
// false or stop is called: the load a test keeps on while it changes
// what that load reads (writes a table, reloads a config). stop returns
// once every goroutine has; call it once.
func Repeat(n int, f func() bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if !f() {
					return
				}
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
	}
}
