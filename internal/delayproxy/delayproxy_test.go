package delayproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/floodgatehq/caddy-ratelimit/internal/testutil"
)

// echoServer answers every line with itself, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeConns(t, ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
	return ln.Addr().String()
}

func startProxy(t *testing.T, target string, delay time.Duration) *Proxy {
	t.Helper()
	p, err := Start(target, delay)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// echoThrough is a connection to an echo server through a proxy of delay.
func echoThrough(t *testing.T, delay time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", startProxy(t, echoServer(t), delay).Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestDelayEachWay: a round trip through the proxy takes at least the
// delay twice, and not much more on an idle machine.
func TestDelayEachWay(t *testing.T) {
	const delay = 20 * time.Millisecond
	c := echoThrough(t, delay)
	r := bufio.NewReader(c)
	for i := range 5 {
		start := time.Now()
		if _, err := fmt.Fprintf(c, "ping %d\n", i); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		rtt := time.Since(start)
		if line != fmt.Sprintf("ping %d\n", i) {
			t.Fatalf("echo %q", line)
		}
		if rtt < 2*delay {
			t.Fatalf("round trip %s, want at least %s", rtt, 2*delay)
		}
		if rtt > 2*delay+time.Second {
			t.Fatalf("round trip %s, far beyond %s", rtt, 2*delay)
		}
	}
}

// TestOrderAndThroughput: many writes in a row arrive whole and in order,
// and the delay is paid once for the stream, not once per write.
func TestOrderAndThroughput(t *testing.T) {
	const delay = 20 * time.Millisecond
	c := echoThrough(t, delay)
	const lines = 2000
	start := time.Now()
	go func() {
		w := bufio.NewWriter(c)
		for i := range lines {
			fmt.Fprintf(w, "line %d\n", i)
			if i%50 == 0 {
				_ = w.Flush()
			}
		}
		_ = w.Flush()
	}()
	r := bufio.NewReader(c)
	for i := range lines {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if want := fmt.Sprintf("line %d\n", i); line != want {
			t.Fatalf("got %q, want %q", line, want)
		}
	}
	if took := time.Since(start); took > 40*delay {
		t.Fatalf("%d lines took %s: the delay was paid per chunk in turn, not once", lines, took)
	}
}

// TestCloseEndsConnections: after Close, a connection through the proxy
// reads EOF or an error instead of hanging, and new ones are refused.
func TestCloseEndsConnections(t *testing.T) {
	p, err := Start(echoServer(t), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintf(c, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read through a closed proxy succeeded")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a connection through a closed proxy hung")
	}
	if c2, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c2.Close()
		t.Fatal("a closed proxy accepted a connection")
	}
}

// TestNegativeDelayRefused: a negative delay is a mistake, not zero.
func TestNegativeDelayRefused(t *testing.T) {
	if _, err := Start("127.0.0.1:1", -time.Millisecond); err == nil {
		t.Fatal("a negative delay was accepted")
	}
}
