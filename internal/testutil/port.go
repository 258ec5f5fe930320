package testutil

import (
	"fmt"
	"net"
	"strconv"
)

// FreePort asks the kernel for a free port on host (127.0.0.1 or ::1; tests
// listen on nothing else). Another process may take it before the program
// binds it, so callers retry a start that fails to bind.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	return strconv.Atoi(port)
}
