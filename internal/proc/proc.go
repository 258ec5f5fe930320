// Package proc holds what the test harnesses that run other programs
// (caddyproc for Caddy, redistest for redis-server) share: loopback ports
// and stopping a process without hanging the test.
package proc

import (
	"fmt"
	"net"
	"os"
	"time"
)

// FreePort asks the kernel for a free loopback port. Another process may
// take it before the program binds it, so callers retry a start that fails
// to bind.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Stop sends p the signals in order, waits up to grace for done (closed
// once the process has exited and been waited for), and kills it if it is
// still running then, so a process that ignores its signals cannot hang a
// test.
func Stop(p *os.Process, done <-chan struct{}, grace time.Duration, signals ...os.Signal) {
	for _, sig := range signals {
		_ = p.Signal(sig)
	}
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.Kill()
		<-done
	}
}
