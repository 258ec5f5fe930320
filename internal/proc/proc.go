// Package proc holds what the test harnesses that run other programs
// (caddyproc for Caddy, redistest for redis-server) share: stopping a
// process without hanging the test.
package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
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

// Listens reports whether process pid has a socket listening on TCP
// port, read from /proc. A harness that picks a free port and starts a
// server on it cannot tell from an answer alone that the server is its
// own: when another test process (go test runs packages in parallel)
// started one on the same port a moment earlier, the new server fails to
// bind and exits, and meanwhile the other answers every probe, so two
// tests would share one server and count each other's requests. Where
// /proc cannot be read (not Linux) it reports true: the check is then
// the answer alone, as before.
func Listens(pid, port int) bool {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return !procReadable()
	}
	sockets := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			sockets[strings.TrimSuffix(inode, "]")] = true
		}
	}
	want := fmt.Sprintf(":%04X", port)
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) > 9 && f[3] == "0A" && strings.HasSuffix(f[1], want) && sockets[f[9]] {
				return true
			}
		}
	}
	return false
}

// procReadable reports whether this system has Linux's /proc.
func procReadable() bool {
	_, err := os.Stat("/proc/self/fd")
	return err == nil
}
