package proc

import (
	"net"
	"os"
	"os/exec"
	"testing"
)

// TestListens: a process is said to listen on the ports it listens on,
// and on no other, and another process is not said to listen on them.
func TestListens(t *testing.T) {
	if !procReadable() {
		t.Skip("no /proc here")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if !Listens(os.Getpid(), port) {
		t.Errorf("this process listens on %d but Listens says no", port)
	}
	// A connected socket on the port is no listener of another port.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := c.LocalAddr().(*net.TCPAddr).Port
	if Listens(os.Getpid(), local) {
		t.Errorf("Listens says yes for %d, a connected socket's port", local)
	}
	sleeper := exec.Command("sleep", "10")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	if Listens(sleeper.Process.Pid, port) {
		t.Errorf("Listens says another process listens on %d, which this one holds", port)
	}
}
