// Package delayproxy puts a fixed delay between a client and a server on
// loopback: a TCP proxy that holds every byte for the same time in each
// direction before passing it on, in order. Tests and benchmarks use it to
// stand an instance as far from its Redis as another zone or a managed
// service would be (a 20 ms delay each way is a 40 ms round trip), which
// loopback alone never shows: a request that waits for Redis then waits
// that long, and one decided from memory does not.
//
// The delay is per chunk read, measured from when the proxy read it, so
// a stream keeps its throughput and only its latency grows, as over a
// long link; nothing is dropped or reordered.
package delayproxy

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy listens on a free 127.0.0.1 port and forwards each connection to
// its target with the delay in each direction.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and forwards what it accepts to
// target, delaying every chunk by delay in each direction.
func Start(target string, delay time.Duration) (*Proxy, error) {
	return StartOn("127.0.0.1:0", target, delay)
}

// StartOn is Start listening on addr: a proxy closed and started again on
// its address stands for a link cut and restored, the server behind it
// keeping its state.
func StartOn(addr, target string, delay time.Duration) (*Proxy, error) {
	if delay < 0 {
		return nil, fmt.Errorf("delayproxy: negative delay %s", delay)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("delayproxy: listening: %w", err)
	}
	p := &Proxy{ln: ln, target: target, delay: delay, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients connect to instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops listening, closes every connection in both directions and
// waits for the proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// track remembers c so Close can close it; it reports false (and closes
// c) once the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) forget(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve forwards one connection: two delayed pipes, and when either side
// ends, both connections close.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.forget(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(server) {
		return
	}
	defer p.forget(server)
	done := make(chan struct{}, 2)
	go func() { p.pipe(server, client); done <- struct{}{} }()
	go func() { p.pipe(client, server); done <- struct{}{} }()
	<-done
	// One direction ended: end the other, as a broken link would.
	_ = client.Close()
	_ = server.Close()
	<-done
}

// chunk is what one read brought, and when it may be written on.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst, each chunk delay after it was read. Reading
// goes on while earlier chunks wait, so the delay adds latency, not
// pauses between chunks.
func (p *Proxy) pipe(dst io.Writer, src io.Reader) {
	queue := make(chan chunk, 256)
	go func() {
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				queue <- chunk{data: buf[:n], due: time.Now().Add(p.delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range queue {
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(c.data); err != nil {
			// The other side is gone: drain the reader so it ends too.
			for range queue {
			}
			return
		}
	}
}
