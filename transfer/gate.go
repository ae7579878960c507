package transfer

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// gate is the listener the HTTP server takes its connections from. It
// accepts TCP connections itself and completes their TLS handshakes (which
// require a client certificate of the deployment) before the server sees
// them, so a connection that has not authenticated never holds one of the
// server's connection slots. Until its handshake completes a connection
// holds a pending slot, for at most the handshake deadline: at most
// perPeer of them per source address, and at most pending in all.
//
// A source address is not a peer: where pods' traffic is masqueraded
// behind their node's address, a pod that opens perPeer idle connections
// would hold every pending slot of its node's driver. So a newcomer from
// an address at its cap evicts that address's oldest pending connection
// if that one has waited a tenth of the handshake deadline (a driver's
// handshake takes milliseconds): idle ones make room, and a flood that
// reconnects as fast as it is evicted only churns its own connections,
// never one younger than that.
// When every pending slot is taken, a newcomer evicts the oldest pending
// connection of the address that holds the most, if that address holds at
// least two more than the newcomer's: a flood cannot keep a peer with few
// connections from its turn unless it comes from about as many addresses
// as there are pending slots.
//
// Once authenticated, a connection counts by the node its certificate
// names: at most perName of them per node, so one node with a valid
// certificate cannot hold all of the server's slots.
//
// Before all that, the first bytes are read (sniff): a connection that
// knocks (knock.go) and proves a certificate of the deployment takes a
// pending slot counted by the certificate's name instead (perPeer of them
// per name), out of reach of any flood; one that does not goes on to the
// slots by address with the bytes read put back. While its first bytes
// are awaited a connection holds a sniffing slot, for at most the
// handshake deadline, maxSniff of them in all: a newcomer when all are
// taken closes the oldest (a driver's knock or ClientHello comes within a
// round trip, an idle flood's never).
type gate struct {
	ln        net.Listener
	tls       *tls.Config
	handshake time.Duration
	perPeer   int
	pending   int
	// slots are the authenticated connections' (the server's limit);
	// an authenticated connection waits at most the handshake deadline
	// for one, then is closed.
	slots chan struct{}
	// release frees the slot of an authenticated connection, by the
	// connection, when the HTTP server is done with it.
	release sync.Map
	// nameOf is the node an authenticated connection's certificate
	// names; perName caps those of one name (byName counts them).
	nameOf  func(*tls.Conn) string
	perName int
	byName  map[string]int

	ready chan net.Conn
	done  chan struct{}
	stop  sync.Once

	// creds check knocks (nil: none are taken, every connection goes to
	// the slots by address).
	creds *Credentials

	mu     sync.Mutex
	total  int
	byPeer map[netip.Addr]*list.List // of *waiting, oldest first
	// sniffs are the connections whose first bytes are awaited, oldest
	// first; knocked counts the pending knocked ones by name, and
	// knockedConns holds them for Close.
	sniffs       *list.List // of net.Conn
	knocked      map[string]int
	knockedConns map[*waiting]struct{}
}

// maxSniff bounds the connections whose first bytes are awaited.
const maxSniff = 1024

// waiting is a connection in its handshake.
type waiting struct {
	since time.Time
	conn  net.Conn
	peer  netip.Addr
	el    *list.Element
	done  bool // its slot is released
	// knocked names the certificate its knock proved ("" for none).
	knocked string
}

func newGate(ln net.Listener, cfg *tls.Config, handshake time.Duration, perPeer, pending, conns, perName int, nameOf func(*tls.Conn) string, creds *Credentials) *gate {
	g := &gate{ln: ln, tls: cfg, handshake: handshake, perPeer: perPeer, pending: pending,
		slots: make(chan struct{}, conns), ready: make(chan net.Conn), done: make(chan struct{}),
		byPeer: map[netip.Addr]*list.List{}, nameOf: nameOf, perName: perName, byName: map[string]int{},
		creds: creds, sniffs: list.New(), knocked: map[string]int{}, knockedConns: map[*waiting]struct{}{}}
	go g.acceptLoop()
	return g
}

// Accept returns the next authenticated connection (a *tls.Conn whose
// handshake is complete).
func (g *gate) Accept() (net.Conn, error) {
	select {
	case c := <-g.ready:
		return c, nil
	case <-g.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; connections in their handshake are closed.
func (g *gate) Close() error {
	err := g.ln.Close()
	g.stop.Do(func() {
		close(g.done)
		g.mu.Lock()
		for _, l := range g.byPeer {
			for e := l.Front(); e != nil; e = e.Next() {
				e.Value.(*waiting).conn.Close()
			}
		}
		for e := g.sniffs.Front(); e != nil; e = e.Next() {
			e.Value.(net.Conn).Close()
		}
		for w := range g.knockedConns {
			w.conn.Close()
		}
		g.mu.Unlock()
	})
	return err
}

// Addr is the listener's.
func (g *gate) Addr() net.Addr { return g.ln.Addr() }

func (g *gate) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := g.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				g.Close()
				return
			}
			// Out of descriptors, say: wait a little, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(backoff):
				continue
			case <-g.done:
				return
			}
		}
		backoff = 0
		if g.creds != nil {
			g.sniff(c)
			continue
		}
		w := g.admit(c)
		if w == nil {
			c.Close()
			continue
		}
		go g.handshakeOf(w)
	}
}

// sniff awaits c's first bytes, holding a sniffing slot (closing the
// oldest if all are taken), and sends it on to the slots of a knock or to
// those by address.
func (g *gate) sniff(c net.Conn) {
	g.mu.Lock()
	if g.sniffs.Len() >= maxSniff {
		g.sniffs.Remove(g.sniffs.Front()).(net.Conn).Close()
	}
	el := g.sniffs.PushBack(c)
	g.mu.Unlock()
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(g.handshake)) // a conn that cannot have one fails its read
		head := make([]byte, len(knockMagic))
		_, err := io.ReadFull(c, head)
		g.mu.Lock()
		g.sniffs.Remove(el) // a no-op if it was closed to make room
		g.mu.Unlock()
		if err != nil {
			c.Close()
			return
		}
		var w *waiting
		if string(head) == knockMagic {
			name, err := g.creds.readKnock(c)
			if err != nil {
				c.Close()
				return
			}
			w = g.admitKnocked(c, name)
		} else {
			w = g.admit(&prefixConn{Conn: c, head: head})
		}
		if w == nil {
			c.Close()
			return
		}
		_ = c.SetReadDeadline(time.Time{}) // the handshake sets its own
		g.handshakeOf(w)
	}()
}

// admitKnocked gives c, whose knock proved a certificate naming name, one
// of that name's pending slots; nil if it holds all of them.
func (g *gate) admitKnocked(c net.Conn, name string) *waiting {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.knocked[name] >= g.perPeer {
		return nil
	}
	g.knocked[name]++
	w := &waiting{conn: c, since: time.Now(), knocked: name}
	g.knockedConns[w] = struct{}{}
	return w
}

// prefixConn is a connection whose first bytes were read already: Read
// gives them back first.
type prefixConn struct {
	net.Conn
	head []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.head) > 0 {
		n := copy(b, p.head)
		p.head = p.head[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// admit gives c a pending slot, evicting one if every slot is taken (see
// gate); nil if there is none for it.
func (g *gate) admit(c net.Conn) *waiting {
	peer := netip.Addr{}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		peer = ap.Addr().Unmap()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	mine := g.byPeer[peer]
	have := 0
	if mine != nil {
		have = mine.Len()
	}
	if have >= g.perPeer {
		// Its own oldest makes room, if it has waited long enough to be
		// idle (see gate).
		oldest := mine.Front().Value.(*waiting)
		if time.Since(oldest.since) < g.handshake/10 {
			return nil
		}
		g.releaseLocked(oldest)
		oldest.conn.Close()
		have--
	}
	if g.total >= g.pending {
		var most *list.List
		for _, l := range g.byPeer {
			if most == nil || l.Len() > most.Len() {
				most = l
			}
		}
		if most.Len() < have+2 {
			return nil
		}
		oldest := most.Front().Value.(*waiting)
		g.releaseLocked(oldest)
		oldest.conn.Close()
	}
	if mine = g.byPeer[peer]; mine == nil {
		mine = list.New()
		g.byPeer[peer] = mine
	}
	w := &waiting{conn: c, peer: peer, since: time.Now()}
	w.el = mine.PushBack(w)
	g.total++
	return w
}

func (g *gate) releaseLocked(w *waiting) {
	if w.done {
		return
	}
	w.done = true
	if w.knocked != "" {
		delete(g.knockedConns, w)
		if g.knocked[w.knocked]--; g.knocked[w.knocked] <= 0 {
			delete(g.knocked, w.knocked)
		}
		return
	}
	g.total--
	l := g.byPeer[w.peer]
	l.Remove(w.el)
	if l.Len() == 0 {
		delete(g.byPeer, w.peer)
	}
}

// handshakeOf completes w's TLS handshake within the deadline and hands
// the connection to Accept once it has a slot.
func (g *gate) handshakeOf(w *waiting) {
	deadline := time.Now().Add(g.handshake)
	// A connection whose deadline cannot be set is closed by the failed
	// handshake that follows.
	_ = w.conn.SetDeadline(deadline)
	tc := tls.Server(w.conn, g.tls)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	err := tc.HandshakeContext(ctx)
	cancel()
	g.mu.Lock()
	g.releaseLocked(w)
	g.mu.Unlock()
	if err != nil {
		answerPlainHTTP(err)
		tc.Close()
		return
	}
	name := g.nameOf(tc)
	if w.knocked != "" && name != w.knocked {
		tc.Close() // a knock for one certificate, a handshake with another
		return
	}
	g.mu.Lock()
	full := g.byName[name] >= g.perName
	if !full {
		g.byName[name]++
	}
	g.mu.Unlock()
	if full {
		tc.Close()
		return
	}
	unname := func() {
		g.mu.Lock()
		if g.byName[name]--; g.byName[name] <= 0 {
			delete(g.byName, name)
		}
		g.mu.Unlock()
	}
	select {
	case g.slots <- struct{}{}:
	case <-time.After(time.Until(deadline)):
		unname()
		tc.Close()
		return
	case <-g.done:
		unname()
		tc.Close()
		return
	}
	_ = w.conn.SetDeadline(time.Time{}) // the stream's own deadlines follow
	g.release.Store(tc, sync.OnceFunc(func() { <-g.slots; unname() }))
	select {
	case g.ready <- tc:
	case <-g.done:
		g.closed(tc)
		tc.Close()
	}
}

// closed frees the slot of an authenticated connection the server is done
// with (http.Server.ConnState: closed or hijacked).
func (g *gate) closed(c net.Conn) {
	if f, ok := g.release.LoadAndDelete(c); ok {
		f.(func())()
	}
}

// answerPlainHTTP tells a client that spoke plain HTTP to the TLS port
// what it did, as net/http's own TLS server does.
func answerPlainHTTP(err error) {
	var re tls.RecordHeaderError
	if !errors.As(err, &re) || re.Conn == nil {
		return
	}
	switch string(re.RecordHeader[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		_, _ = re.Conn.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"))
	}
}
