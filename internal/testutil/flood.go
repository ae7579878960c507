package testutil

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Flood opens, from each of peers source addresses (127.0.0.2 onwards),
// each TCP connections to addr that never finish a TLS handshake: idle,
// or, with hello, a record header promising a ClientHello that never
// comes. Each is reopened as soon as the server closes it. It runs until
// the returned stop is called (which waits for it to end); open tells how
// many connections the flood holds at the moment.
func Flood(addr string, peers, each int, hello bool) (open func() int64, stop func()) {
	return FloodFrom(addr, 2, peers, each, hello)
}

// FloodFrom is Flood from the source addresses 127.0.0.first onwards
// (first 1: the address a test's own client dials from, as a pod's
// connections masqueraded behind its node's address share the node's).
func FloodFrom(addr string, first byte, peers, each int, hello bool) (open func() int64, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var n atomic.Int64
	for p := range peers {
		local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, first+byte(p))}
		for range each {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := net.Dialer{LocalAddr: local, Timeout: time.Second}
				for ctx.Err() == nil {
					c, err := d.DialContext(ctx, "tcp", addr)
					if err != nil {
						time.Sleep(10 * time.Millisecond)
						continue
					}
					n.Add(1)
					if hello {
						_, _ = c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03})
					}
					closed := make(chan struct{})
					go func() {
						select {
						case <-ctx.Done():
						case <-closed:
						}
						c.Close()
					}()
					_, _ = c.Read(make([]byte, 1)) // until the server closes it
					close(closed)
					n.Add(-1)
				}
			}()
		}
	}
	return n.Load, func() { cancel(); wg.Wait() }
}
