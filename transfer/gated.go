package transfer

import (
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// GateOptions bound a gated listener (Gate). Handshake is the deadline of
// a connection's TLS handshake; PerPeer and Pending cap the connections
// in their handshake from one source address and in all (PerPeer also
// those of one knocking certificate); Conns caps the authenticated
// connections, PerName those whose certificate NameOf names alike. Creds,
// if set, check knocks (knock.go).
type GateOptions struct {
	Handshake        time.Duration
	PerPeer, Pending int
	Conns, PerName   int
	NameOf           func(*tls.Conn) string
	Creds            *Credentials
}

// Gate returns a listener over ln that hands out only connections whose
// TLS handshake under cfg is complete, each a *GatedConn: a server behind
// it (gRPC's, the control endpoint's) never holds a slot for a connection
// that has not authenticated, and an address that opens idle connections
// makes room for others instead of keeping them out (see gate, which the
// transfer's own server uses too). Closing a GatedConn frees its slot.
func Gate(ln net.Listener, cfg *tls.Config, o GateOptions) net.Listener {
	return gatedListener{newGate(ln, cfg, o.Handshake, o.PerPeer, o.Pending, o.Conns, o.PerName, o.NameOf, o.Creds)}
}

type gatedListener struct{ *gate }

// Accept returns the next authenticated connection.
func (l gatedListener) Accept() (net.Conn, error) {
	c, err := l.gate.Accept()
	if err != nil {
		return nil, err
	}
	return &GatedConn{Conn: c.(*tls.Conn), g: l.gate}, nil
}

// GatedConn is a connection a Gate handed out, its TLS handshake done
// (ConnectionState says with whom).
type GatedConn struct {
	*tls.Conn
	g    *gate
	once sync.Once
}

// Close closes the connection and frees its slot.
func (c *GatedConn) Close() error {
	c.once.Do(func() { c.g.closed(c.Conn) })
	return c.Conn.Close()
}
