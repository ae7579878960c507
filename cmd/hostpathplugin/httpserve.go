package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// The driver's and the signer's plain HTTP endpoints (/healthz, /metrics)
// answer anyone who reaches the port, before any authentication, so what
// a connection may hold is bounded: a header within httpHeaderTimeout, a
// request within httpReadTimeout, an idle keep-alive connection closed
// after httpIdleTimeout, and at most httpMaxConns connections at once,
// httpPerPeer of one address (capListener says who makes room). Without
// these, 8,000 idle keep-alive connections held 163 MB of a driver's
// memory.
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

// listenHTTP listens on addr and holds at most max connections at a time,
// at most httpPerPeer from one source address.
func listenHTTP(addr string, max int) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &capListener{Listener: l, max: max, perPeer: min(max, httpPerPeer), minAge: httpMinAge, held: map[*slotConn]struct{}{}, byPeer: map[netip.Addr]int{}}, nil
}

// httpPerPeer caps one source address's connections, and httpMinAge is
// how long a connection has had nothing to read before a newcomer may
// evict it. Kubelet's probe reads its answer within milliseconds, so it
// is never the one evicted: connections held idle by a pod (or by many)
// make room for it instead of keeping it out, and the driver is not
// restarted for failing probes it never got to answer.
const (
	httpPerPeer = 8
	httpMinAge  = 250 * time.Millisecond
)

// capListener bounds the connections it hands out (see listenHTTP). A
// newcomer beyond a bound evicts one held (victimLocked) or is closed at
// once rather than left in the backlog.
type capListener struct {
	net.Listener
	max, perPeer int
	// minAge is httpMinAge (a test's bounds set it otherwise).
	minAge time.Duration

	mu     sync.Mutex
	held   map[*slotConn]struct{}
	byPeer map[netip.Addr]int
}

// Accept implements net.Listener.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if sc := l.admit(c); sc != nil {
			return sc, nil
		}
		c.Close()
	}
}

// admit holds c, evicting another if a bound says so; nil if c is not held.
func (l *capListener) admit(c net.Conn) *slotConn {
	var peer netip.Addr
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		peer = ap.Addr().Unmap()
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byPeer[peer] >= l.perPeer || len(l.held) >= l.max {
		victim := l.victimLocked(peer, now)
		if victim == nil {
			return nil
		}
		l.releaseLocked(victim)
		victim.Conn.Close()
	}
	sc := &slotConn{Conn: c, l: l, peer: peer}
	sc.last.Store(now.UnixNano())
	l.held[sc] = struct{}{}
	l.byPeer[peer]++
	return sc
}

// victimLocked is the connection a newcomer from peer evicts, or nil. An
// address at its cap evicts its own oldest, if that one has waited
// minAge (httpMinAge): a flood that reconnects as fast as it is evicted churns its
// own connections. When every slot is taken, the newcomer evicts the
// oldest of the address holding the most, if that address holds at least
// two more than the newcomer's: a flood keeps a probe from its node's
// address out only if it comes from about as many addresses as there are
// slots.
func (l *capListener) victimLocked(peer netip.Addr, now time.Time) *slotConn {
	from, minAge := peer, l.minAge
	if l.byPeer[peer] < l.perPeer {
		for p, n := range l.byPeer {
			if n > l.byPeer[from] {
				from = p
			}
		}
		if l.byPeer[from] < l.byPeer[peer]+2 {
			return nil
		}
		minAge = 0
	}
	var victim *slotConn
	for h := range l.held {
		if h.peer != from || now.Sub(time.Unix(0, h.last.Load())) < minAge {
			continue
		}
		if victim == nil || h.last.Load() < victim.last.Load() {
			victim = h
		}
	}
	return victim
}

// releaseLocked gives c's slot back, once.
func (l *capListener) releaseLocked(c *slotConn) {
	if _, ok := l.held[c]; !ok {
		return
	}
	delete(l.held, c)
	if l.byPeer[c.peer]--; l.byPeer[c.peer] <= 0 {
		delete(l.byPeer, c.peer)
	}
}

// slotConn is a held connection: when it last read a byte, and its slot
// given back when it is closed.
type slotConn struct {
	net.Conn
	l    *capListener
	peer netip.Addr
	last atomic.Int64 // unix nanoseconds: accepted, or last read a byte
}

// Read implements net.Conn.
func (c *slotConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// Close implements net.Conn.
func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
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
