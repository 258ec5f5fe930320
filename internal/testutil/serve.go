package testutil

import (
	"net"
	"testing"
)

// ServeConns accepts connections on ln until the test ends (ln is closed
// at cleanup) and hands each to handle in a goroutine of its own, which
// closes the connection when handle returns: the accept loop of every
// stand-in server a test starts.
func ServeConns(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}
