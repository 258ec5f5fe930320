// Package proc holds what the test harnesses that run other programs
// (caddyproc for Caddy, redistest for redis-server) share: stopping a
// process without hanging the test.
package proc

import (
	"os"
	"os/exec"
	"sync"
	"time"
)

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

// Take returns the process a harness holds in *cmd (with *done, the
// channel that closes when it has exited) and clears *cmd, under mu, so
// of several callers stopping it only one gets it; the others get nil.
func Take(mu *sync.Mutex, cmd **exec.Cmd, done *chan struct{}) (*exec.Cmd, chan struct{}) {
	mu.Lock()
	defer mu.Unlock()
	c := *cmd
	*cmd = nil
	return c, *done
}
