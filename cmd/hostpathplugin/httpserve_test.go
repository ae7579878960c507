package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHTTPEndpointBounds: a flood of idle connections to the health and
// metrics port holds at most the cap (the rest are closed as accepted),
// the server closes a silent one after its header timeout, and the port
// answers again as soon as the flood lets go.
func TestHTTPEndpointBounds(t *testing.T) {
	const max = 8
	ln, err := listenHTTP("127.0.0.1:0", max)
	if err != nil {
		t.Fatal(err)
	}
	// No eviction here (that is TestHTTPProbeThroughAFlood's): a slow
	// accept on a busy machine would otherwise let the newcomers evict
	// the held ones, whose close is counted later, on their own
	// goroutines.
	ln.(*capListener).minAge = time.Hour
	var open, peak atomic.Int64
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv.ReadHeaderTimeout = 3 * time.Second
	srv.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			if n := open.Add(1); n > peak.Load() {
				peak.Store(n)
			}
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	go srv.Serve(ln)
	defer srv.Close()
	addr := ln.Addr().String()

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	closed := 0
	for range 200 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Those beyond the cap are closed at once: a read ends with EOF (or a
	// reset) well before the header timeout. All are read at once.
	ended := make(chan bool, len(conns))
	for _, c := range conns {
		go func() {
			c.SetReadDeadline(time.Now().Add(time.Second))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			ended <- err != nil && (!errors.As(err, &ne) || !ne.Timeout())
		}()
	}
	for range conns {
		if <-ended {
			closed++
		}
	}
	if p := peak.Load(); p > max {
		t.Fatalf("the server held %d connections at once, more than its cap of %d", p, max)
	}
	if closed < 200-max {
		t.Fatalf("%d of 200 connections were closed at once, want at least %d", closed, 200-max)
	}
	// The silent ones within the cap are closed after the header timeout.
	deadline := time.Now().Add(15 * time.Second)
	for open.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := open.Load(); n != 0 {
		t.Fatalf("%d silent connections still open after the header timeout", n)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("after the flood: %v", err)
	}
	resp.Body.Close()
	if srv.IdleTimeout != httpIdleTimeout || srv.ReadTimeout != httpReadTimeout || srv.MaxHeaderBytes != httpMaxHeader {
		t.Fatalf("the server's bounds: %+v", srv)
	}
}

// TestHTTPProbeThroughAFlood: with every connection slot held by idle
// connections from a few addresses, reopened as soon as they are closed,
// kubelet's probe from its own address is answered every time: one of
// theirs makes room for it.
func TestHTTPProbeThroughAFlood(t *testing.T) {
	ln, err := listenHTTP("127.0.0.1:0", httpMaxConns)
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	go srv.Serve(ln)
	defer srv.Close()
	addr := ln.Addr().String()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The flood comes from four addresses (pods), kubelet from another
	// (its node's); each flooder holds a connection, and another as soon
	// as it is closed.
	for i := range 2 * httpMaxConns {
		wg.Add(1)
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%4))}}
		go func() {
			defer wg.Done()
			for {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					return
				}
				// Longer than the probe may wait: without eviction
				// the probe would wait for one of these to give up.
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				c.Read(make([]byte, 1))
				c.Close()
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	defer func() { close(stop); srv.Close(); wg.Wait() }()
	time.Sleep(2 * httpMinAge) // the flood holds every slot
	probe := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 6 {
		resp, err := probe.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("probe %d of 6 during the flood: %v", i+1, err)
		}
		resp.Body.Close()
		time.Sleep(100 * time.Millisecond)
	}
}
