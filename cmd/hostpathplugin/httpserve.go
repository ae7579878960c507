package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// The driver's and the signer's plain HTTP endpoints (/healthz, /metrics)
// answer anyone who reaches the port, before any authentication, so what
// a connection may hold is bounded: a header within httpHeaderTimeout, a
// request within httpReadTimeout, an idle keep-alive connection closed
// after httpIdleTimeout, and at most httpMaxConns connections at once
// (the rest closed as they are accepted). Without these, 8,000 idle
// keep-alive connections held 163 MB of a driver's memory.
const (
	httpHeaderTimeout = 5 * time.Second
	httpReadTimeout   = 10 * time.Second
	httpWriteTimeout  = 30 * time.Second
	httpIdleTimeout   = 30 * time.Second
	httpMaxHeader     = 16 << 10
	httpMaxConns      = 32
)

// newHTTPServer is an http.Server with those bounds.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: httpHeaderTimeout, ReadTimeout: httpReadTimeout,
		WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout, MaxHeaderBytes: httpMaxHeader}
}

// serveHTTP serves h on addr with those bounds until stop is called;
// onErr is told if serving ends otherwise.
func serveHTTP(addr string, h http.Handler, onErr func(error)) (stop func(), err error) {
	ln, err := listenHTTP(addr, httpMaxConns)
	if err != nil {
		return nil, err
	}
	srv := newHTTPServer(h)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			onErr(err)
		}
	}()
	return func() { srv.Close() }, nil
}

// listenHTTP listens on addr and accepts at most max connections at a time.
func listenHTTP(addr string, max int) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &capListener{Listener: l, slots: make(chan struct{}, max)}, nil
}

// capListener closes each connection accepted beyond its slots at once,
// rather than leave it in the backlog: the kubelet's next probe gets a
// slot as soon as one frees, and a flood costs a close per connection.
type capListener struct {
	net.Listener
	slots chan struct{}
}

// Accept implements net.Listener.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
		default:
			c.Close()
		}
	}
}

// slotConn gives its slot back once, when it is closed.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

// Close implements net.Conn.
func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}

// serveReady serves /healthz at addr (nothing when addr is empty): 200
// while ready says nil, else 503 with its words. It returns the stop.
func serveReady(addr string, ready func() error) (stop func()) {
	if addr == "" {
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	fail := func(err error) { klog.ErrorS(err, "http endpoint", "address", addr) }
	stop, err := serveHTTP(addr, mux, fail)
	if err != nil {
		fail(err)
		return func() {}
	}
	return stop
}
