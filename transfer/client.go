package transfer

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client fetches sources from the other nodes of its deployment.
type Client struct {
	Creds *Credentials
	// Timeout bounds connecting and waiting for the answer's header (not
	// the stream); zero means 10 seconds. IdleTimeout ends a stream from
	// which nothing arrives for that long (ErrIncomplete); zero means a
	// minute.
	Timeout, IdleTimeout time.Duration
	// MaxPeerLifetime is the longest validity a server's certificate may
	// have; zero means what this node's own are made for (see Server).
	MaxPeerLifetime time.Duration
}

// Open asks the node named node, at addr (host:port), for a source: its
// Meta and, unless statOnly, a reader of its bytes that returns
// ErrIncomplete rather than io.EOF when the stream was cut or altered.
// The server must prove it is node of the same driver.
func (c *Client) Open(ctx context.Context, addr, node, kind, id string, statOnly bool) (Meta, io.ReadCloser, error) {
	roots, leaf, err := c.Creds.current()
	if err != nil {
		return Meta{}, nil, err
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	idle := c.IdleTimeout
	if idle <= 0 {
		idle = time.Minute
	}
	driver := c.Creds.Driver
	maxLife := c.MaxPeerLifetime
	if maxLife <= 0 {
		maxLife = c.Creds.maxPeerLifetime()
	}
	tlsConfig := &tls.Config{
		Time:         c.Creds.now,
		MinVersion:   tls.VersionTLS13,
		RootCAs:      roots,
		ServerName:   node,
		Certificates: []tls.Certificate{*leaf},
		// The chain and the node's name are checked by crypto/tls;
		// this checks that it is a node of this driver too.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || peerNode(cs.PeerCertificates[0], driver) != node {
				return fmt.Errorf("%w: %s does not present node %s of driver %s", ErrRefused, addr, node, driver)
			}
			return checkLifetime(cs.PeerCertificates[0], maxLife)
		},
	}
	tr := &http.Transport{
		// Each connection knocks first (knock.go); one whose knock the
		// server does not take (the previous release's) is dialled
		// again without.
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dial := func() (net.Conn, error) {
				c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &idleConn{Conn: c, idle: idle}, nil
			}
			var err error
			for _, knock := range []bool{true, false} {
				var raw net.Conn
				if raw, err = dial(); err != nil {
					return nil, err
				}
				if knock {
					if err = c.Creds.KnockOn(raw, node); err != nil {
						raw.Close()
						return nil, err
					}
				}
				tc := tls.Client(raw, tlsConfig)
				hctx, cancel := context.WithTimeout(ctx, timeout)
				err = tc.HandshakeContext(hctx)
				cancel()
				if err == nil {
					return tc, nil
				}
				tc.Close()
				if errors.Is(err, ErrRefused) || ctx.Err() != nil {
					break
				}
			}
			return nil, err
		},
		ResponseHeaderTimeout:  timeout,
		DisableCompression:     true,
		MaxResponseHeaderBytes: maxHeader + maxMetaBytes,
		ReadBufferSize:         copyBuffer,
	}
	method := http.MethodGet
	if statOnly {
		method = http.MethodHead
	}
	u := url.URL{Scheme: "https", Host: addr, Path: pathPrefix + driver + "/" + kind + "/" + id}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), nil)
	if err != nil {
		return Meta{}, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		tr.CloseIdleConnections()
		if errors.Is(err, ErrRefused) {
			return Meta{}, nil, err
		}
		return Meta{}, nil, fmt.Errorf("%w: %s (%s): %v", ErrUnreachable, node, addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		tr.CloseIdleConnections()
		return Meta{}, nil, fmt.Errorf("%w: node %s: %s", errorOf(resp.StatusCode), node, strings.TrimSpace(string(msg)))
	}
	var m Meta
	if err := json.Unmarshal([]byte(resp.Header.Get(metaHeader)), &m); err != nil {
		resp.Body.Close()
		tr.CloseIdleConnections()
		return Meta{}, nil, fmt.Errorf("%w: node %s sent no valid description: %v", ErrIncomplete, node, err)
	}
	if statOnly {
		resp.Body.Close()
		tr.CloseIdleConnections()
		return m, nil, nil
	}
	return m, &checkedBody{resp: resp, tr: tr, h: crc32.New(castagnoli)}, nil
}

func errorOf(code int) error {
	switch code {
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusBadRequest:
		return ErrInvalid
	case http.StatusServiceUnavailable:
		return ErrBusy
	case http.StatusForbidden, http.StatusMethodNotAllowed:
		return ErrRefused
	}
	return fmt.Errorf("the peer failed (HTTP %d)", code)
}

// checkedBody hashes what it reads and, at the end, compares with the
// trailer the server sends only after a complete stream.
type checkedBody struct {
	resp *http.Response
	tr   *http.Transport
	h    hash.Hash32
}

func (b *checkedBody) Read(p []byte) (int, error) {
	n, err := b.resp.Body.Read(p)
	b.h.Write(p[:n])
	if err == io.EOF {
		want := b.resp.Trailer.Get(sumTrailer)
		if got := strconv.FormatUint(uint64(b.h.Sum32()), 16); want == "" || got != want {
			return n, fmt.Errorf("%w (crc32c %s, sent %q)", ErrIncomplete, got, want)
		}
	} else if err != nil {
		return n, fmt.Errorf("%w: %v", ErrIncomplete, err)
	}
	return n, err
}

func (b *checkedBody) Close() error {
	err := b.resp.Body.Close()
	b.tr.CloseIdleConnections()
	return err
}

// idleConn fails a read that waits longer than idle: a peer that stops
// sending ends the stream rather than holding the restore for ever.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(b []byte) (int, error) {
	if err := c.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

// Peers opens sources on the node a key names (for the CSI driver, the
// node tag its ids carry), found by Resolve.
type Peers struct {
	Client *Client
	// Resolve returns the address (host:port) and name of the node key
	// names; an error there is ErrUnreachable to the caller.
	Resolve func(ctx context.Context, key string) (addr, node string, err error)
}

// Open resolves key and opens the source there (see Client.Open). It
// returns the node's name, or "" if none was found.
func (p *Peers) Open(ctx context.Context, key, kind, id string, statOnly bool) (Meta, io.ReadCloser, string, error) {
	addr, node, err := p.Resolve(ctx, key)
	if err != nil {
		return Meta{}, nil, node, fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	m, rc, err := p.Client.Open(ctx, addr, node, kind, id, statOnly)
	return m, rc, node, err
}
