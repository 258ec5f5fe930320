package testutil

import (
	"fmt"
	"net"
	"strconv"
	"testing"
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

// ClosedAddr returns a 127.0.0.1 address nothing listens on, so a client
// pointed at it is refused at once, as by a server that is down. The port
// was free a moment ago; a test that needs it to stay free binds it.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	port, err := FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}
