package transfer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Meta describes a source: how its bytes are encoded, how many bytes of
// data it holds (what the receiver needs room for) and what else the two
// ends agree on (opaque here).
type Meta struct {
	Format string            `json:"format"`
	Size   int64             `json:"size"`
	Attrs  map[string]string `json:"attrs,omitempty"`
}

// A Source serves what its node holds. Open returns a source's Meta and,
// unless statOnly, a reader of its bytes; Close releases the source (it
// stays pinned until then). Errors that wrap ErrNotFound, ErrInvalid or
// ErrBusy reach the peer as such; any other as a failure.
type Source interface {
	Open(ctx context.Context, peer, kind, id string, statOnly bool) (Meta, io.ReadCloser, error)
}

// Errors a peer gets, from a Source or from the transfer itself.
var (
	ErrNotFound    = errors.New("no such source on that node")
	ErrInvalid     = errors.New("invalid transfer request")
	ErrBusy        = errors.New("the peer is busy")
	ErrRefused     = errors.New("the peer refused the request")
	ErrUnreachable = errors.New("the peer cannot be reached")
	ErrIncomplete  = errors.New("the transfer ended before its end or with the wrong checksum")
)

const (
	metaHeader   = "X-Transfer-Meta"
	sumTrailer   = "X-Transfer-Crc32c"
	pathPrefix   = "/v1/"
	maxHeader    = 4 << 10
	maxMetaBytes = 2 << 10
)

// The trailer is CRC-32C (hardware on amd64 and arm64): TLS already
// authenticates every byte, so the checksum's job is to show the stream
// reached its end, at a cost a restore does not notice.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// copyBuffer is what a stream is copied in: whole TLS records, few
// syscalls.
const copyBuffer = 256 << 10

// Server serves a node's sources to the other nodes of its deployment.
type Server struct {
	Creds  *Credentials
	Source Source
	// Authorizer decides which peer may have which source; nil refuses
	// every request (a server is never open to every node by omission:
	// AllowAll says so).
	Authorizer Authorizer
	// MaxPeerLifetime is the longest validity a peer's certificate may
	// have; zero means what this node's own certificates are made for
	// (Creds' leaf lifetime: 6 hours from a signer), backdated, plus 5
	// minutes.
	MaxPeerLifetime time.Duration
	// MaxStreams is how many sources are read at once (more wait for
	// nothing: they get ErrBusy); MaxConns how many authenticated
	// connections are open at once, MaxConnsPerPeer how many of them one
	// node's certificate may hold. Zero means 4, 64 and 8.
	MaxStreams, MaxConns, MaxConnsPerPeer int
	// StallTimeout ends a stream its reader stopped reading, which would
	// otherwise hold its source pinned; zero means a minute. MinRate
	// ends one that its reader reads too slowly to end in any useful
	// time: every StallTimeout, at least MinRate bytes a second must have
	// moved (zero means 64 KiB/s).
	StallTimeout time.Duration
	MinRate      int64
	// HandshakeTimeout bounds a connection's TLS handshake, before which
	// it is not authenticated and holds none of the MaxConns slots; zero
	// means 3 seconds. MaxPending bounds the connections in their
	// handshake (zero: 256), MaxPendingPerPeer those of one source
	// address (zero: 8): see gate.
	HandshakeTimeout              time.Duration
	MaxPending, MaxPendingPerPeer int
	// HeaderTimeout bounds an authenticated peer's request header, so a
	// connection that drips its header is closed; zero means 10 seconds.
	HeaderTimeout time.Duration

	once    sync.Once
	streams chan struct{}
}

func (s *Server) init() {
	s.once.Do(func() {
		n := s.MaxStreams
		if n <= 0 {
			n = 4
		}
		s.streams = make(chan struct{}, n)
	})
}

// Serve answers on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.init()
	or := func(v, def int) int {
		if v <= 0 {
			return def
		}
		return v
	}
	orDur := func(v, def time.Duration) time.Duration {
		if v <= 0 {
			return def
		}
		return v
	}
	nameOf := func(tc *tls.Conn) string {
		if certs := tc.ConnectionState().PeerCertificates; len(certs) > 0 {
			return peerNode(certs[0], s.Creds.Driver)
		}
		return ""
	}
	g := newGate(ln, s.tlsConfig(), orDur(s.HandshakeTimeout, 3*time.Second),
		or(s.MaxPendingPerPeer, 8), or(s.MaxPending, 256), or(s.MaxConns, 64), or(s.MaxConnsPerPeer, 8), nameOf, s.Creds)
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: orDur(s.HeaderTimeout, 10*time.Second),
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    maxHeader,
		// HTTP/1.1 only: one stream per connection, no window to tune.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ErrorLog:     log.New(io.Discard, "", 0), // a leaf package never logs
		BaseContext:  func(net.Listener) context.Context { return ctx },
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				g.closed(c)
			}
		},
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	// The gate hands over only connections whose TLS handshake, with a
	// client certificate of the deployment, is complete.
	err := srv.Serve(g)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) tlsConfig() *tls.Config {
	// The server checks the peer's certificate per request (ServeHTTP).
	return s.Creds.serverConfig("http/1.1", nil)
}

// serverConfig is the TLS configuration of a server of this node's: its
// current certificate, offering proto, and only clients whose certificate
// chains to an authority trusted now and passes verify (when set). No
// session tickets: a resumed session would skip checking the client's
// certificate against the authorities trusted now.
func (c *Credentials) serverConfig(proto string, verify func(tls.ConnectionState) error) *tls.Config {
	return &tls.Config{
		MinVersion:             tls.VersionTLS13,
		NextProtos:             []string{proto},
		SessionTicketsDisabled: true,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			roots, leaf, err := c.current()
			if err != nil {
				return nil, err
			}
			return &tls.Config{
				Time:                   c.now,
				MinVersion:             tls.VersionTLS13,
				NextProtos:             []string{proto},
				Certificates:           []tls.Certificate{*leaf},
				ClientAuth:             tls.RequireAndVerifyClientCert,
				ClientCAs:              roots,
				SessionTicketsDisabled: true,
				VerifyConnection:       verify,
			}, nil
		},
	}
}

// peerNode returns the node a verified client certificate names for this
// driver (ControllerPeer for the controller's), or "" if it names none.
func peerNode(cert *x509.Certificate, driver string) string {
	for _, u := range cert.URIs {
		if u.Scheme == "csi-transfer" && u.Host == driver && u.Path == "/controller" && cert.Subject.CommonName == ControllerPeer {
			return ControllerPeer
		}
		node, ok := strings.CutPrefix(u.Path, "/node/")
		if u.Scheme == "csi-transfer" && u.Host == driver && ok && node != "" && node == cert.Subject.CommonName {
			return node
		}
	}
	return ""
}

// ServeHTTP answers one request: its method, size, path and peer checked
// before anything is opened.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.init()
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		refuse(w, "a client certificate is required", http.StatusForbidden)
		return
	}
	peer := peerNode(r.TLS.PeerCertificates[0], s.Creds.Driver)
	if peer == "" || peer == ControllerPeer {
		refuse(w, "the certificate names no node of driver "+s.Creds.Driver, http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		refuse(w, "only GET and HEAD", http.StatusMethodNotAllowed)
		return
	}
	if r.ContentLength != 0 || len(r.TransferEncoding) > 0 || r.URL.RawQuery != "" {
		refuse(w, "a request has no body and no query", http.StatusBadRequest)
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, pathPrefix), "/")
	if !strings.HasPrefix(r.URL.Path, pathPrefix) || len(parts) != 3 {
		refuse(w, "the path is /v1/{driver}/{kind}/{id}", http.StatusBadRequest)
		return
	}
	if parts[0] != s.Creds.Driver {
		refuse(w, fmt.Sprintf("this is driver %s, not %s", s.Creds.Driver, parts[0]), http.StatusForbidden)
		return
	}
	maxLife := s.MaxPeerLifetime
	if maxLife <= 0 {
		maxLife = s.Creds.maxPeerLifetime()
	}
	if err := checkLifetime(r.TLS.PeerCertificates[0], maxLife); err != nil {
		refuse(w, err.Error(), http.StatusForbidden)
		return
	}
	// Authorized before a stream slot is taken: a peer refused never
	// holds one, and a slow answer from the authorizer holds none either.
	if err := s.authorize(r.Context(), peer, parts[1], parts[2]); err != nil {
		code := statusOf(err)
		refuse(w, publicMessage(code), code)
		return
	}
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		refuse(w, ErrBusy.Error(), http.StatusServiceUnavailable)
		return
	}
	meta, rc, err := s.Source.Open(r.Context(), peer, parts[1], parts[2], r.Method == http.MethodHead)
	if err != nil {
		// The peer learns the kind of refusal only: the Source's own
		// words may name this node's paths (its log has them).
		code := statusOf(err)
		refuse(w, publicMessage(code), code)
		return
	}
	if rc != nil {
		defer rc.Close()
	}
	mb, err := json.Marshal(meta)
	if err != nil || len(mb) > maxMetaBytes {
		refuse(w, "the source's description is too large", http.StatusInternalServerError)
		return
	}
	w.Header().Set(metaHeader, string(mb))
	w.Header().Set("Content-Type", "application/octet-stream")
	if r.Method == http.MethodHead || rc == nil {
		w.WriteHeader(http.StatusOK)
		return
	}
	w.Header().Set("Trailer", sumTrailer)
	w.WriteHeader(http.StatusOK)
	h := crc32.New(castagnoli)
	stall := s.StallTimeout
	if stall <= 0 {
		stall = time.Minute
	}
	rate := s.MinRate
	if rate <= 0 {
		rate = 64 << 10
	}
	out := &deadlineWriter{w: w, rc: http.NewResponseController(w), stall: stall, minRate: rate}
	// The description goes out before the first byte of data, which may
	// take a while to come (an archive being made): the peer waits for
	// the stream, not for the header.
	if err := out.rc.Flush(); err != nil {
		panic(http.ErrAbortHandler)
	}
	if _, err := io.CopyBuffer(io.MultiWriter(out, h), rc, make([]byte, copyBuffer)); err != nil {
		// No trailer: the peer sees a stream without its checksum.
		panic(http.ErrAbortHandler)
	}
	w.Header().Set(sumTrailer, strconv.FormatUint(uint64(h.Sum32()), 16))
}

// refuse answers a request that gets no source and closes its
// connection: a peer refused holds no slot for its next try.
func refuse(w http.ResponseWriter, msg string, code int) {
	w.Header().Set("Connection", "close")
	http.Error(w, msg, code)
}

func (s *Server) authorize(ctx context.Context, peer, kind, id string) error {
	if s.Authorizer == nil {
		return fmt.Errorf("%w: this server has no authorizer", ErrRefused)
	}
	return s.Authorizer.Authorize(ctx, peer, kind, id)
}

// publicMessage is what a peer is told of a refusal with this status.
func publicMessage(code int) string {
	switch code {
	case http.StatusNotFound:
		return ErrNotFound.Error()
	case http.StatusBadRequest:
		return ErrInvalid.Error()
	case http.StatusServiceUnavailable:
		return ErrBusy.Error()
	case http.StatusForbidden:
		return ErrRefused.Error()
	}
	return "the source could not be opened on that node (its driver's log says why)"
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrBusy):
		return http.StatusServiceUnavailable
	case errors.Is(err, ErrRefused):
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

// deadlineWriter gives every write stall to complete, so a reader that
// stops reading ends its stream instead of holding the source, and ends
// the stream of a reader slower than minRate over any window of stall.
type deadlineWriter struct {
	w       io.Writer
	rc      *http.ResponseController
	stall   time.Duration
	minRate int64 // bytes a second

	since time.Time // the window's start
	moved int64     // bytes written in it
}

// errTooSlow ends a stream read slower than the rate floor.
var errTooSlow = errors.New("the peer reads slower than the transfer's rate floor")

func (d *deadlineWriter) Write(b []byte) (int, error) {
	now := time.Now()
	if d.since.IsZero() {
		d.since = now
	}
	if el := now.Sub(d.since); el >= d.stall {
		if float64(d.moved) < el.Seconds()*float64(d.minRate) {
			return 0, errTooSlow
		}
		d.since, d.moved = now, 0
	}
	if err := d.rc.SetWriteDeadline(now.Add(d.stall)); err != nil {
		return 0, err
	}
	n, err := d.w.Write(b)
	d.moved += int64(n)
	return n, err
}
