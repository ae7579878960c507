package transfer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const driver = "test.hostpath.csi"

// fakeSource serves "blob/<name>" from memory and counts what it opens
// and what is still open.
type fakeSource struct {
	blobs  map[string][]byte
	opened atomic.Int64
	open   atomic.Int64
	// block, when set, makes streams wait for it before their bytes.
	block chan struct{}
}

func (f *fakeSource) Open(ctx context.Context, peer, kind, id string, statOnly bool) (Meta, io.ReadCloser, error) {
	if kind != "blob" || strings.ContainsAny(id, "./") {
		return Meta{}, nil, fmt.Errorf("%w: %s/%s", ErrInvalid, kind, id)
	}
	b, ok := f.blobs[id]
	if !ok {
		return Meta{}, nil, ErrNotFound
	}
	m := Meta{Format: "raw", Size: int64(len(b)), Attrs: map[string]string{"peer": peer}}
	if statOnly {
		return m, nil, nil
	}
	f.opened.Add(1)
	f.open.Add(1)
	var r io.Reader = bytes.NewReader(b)
	if f.block != nil {
		r = io.MultiReader(waitReader{f.block}, r)
	}
	return m, &countedCloser{Reader: r, open: &f.open}, nil
}

type waitReader struct{ c chan struct{} }

func (w waitReader) Read([]byte) (int, error) { <-w.c; return 0, io.EOF }

type countedCloser struct {
	io.Reader
	open *atomic.Int64
	once sync.Once
}

func (c *countedCloser) Close() error { c.once.Do(func() { c.open.Add(-1) }); return nil }

type node struct {
	creds *Credentials
	addr  string
	src   *fakeSource
	srv   *Server
}

// startNode runs a server for a node whose credentials come from store.
func startNode(t *testing.T, store Store, name string, src *fakeSource, tune func(*Server)) *node {
	t.Helper()
	c := &Credentials{Store: store, Driver: driver, Node: name}
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Creds: c, Source: src, Authorizer: AllowAll}
	if tune != nil {
		tune(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return &node{creds: c, addr: ln.Addr().String(), src: src, srv: srv}
}

// nodeCreds are node's credentials from store, refreshed, made for life
// (zero: the default).
func nodeCreds(t *testing.T, store Store, node string, life time.Duration) *Credentials {
	t.Helper()
	c := &Credentials{Store: store, Driver: driver, Node: node, LeafLifetime: life}
	if err := c.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

func fetch(c *Client, n *node, server, id string) ([]byte, Meta, error) {
	m, rc, err := c.Open(context.Background(), n.addr, server, "blob", id, false)
	if err != nil {
		return nil, m, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return b, m, err
}

func TestTransferRoundTripAndRotation(t *testing.T) {
	store := &MemoryStore{}
	payload := bytes.Repeat([]byte("node-local "), 300000)
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": payload}}, nil)
	b := &Credentials{Store: store, Driver: driver, Node: "node-b"}
	if err := b.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	client := &Client{Creds: b}
	got, m, err := fetch(client, a, "node-a", "x")
	if err != nil || !bytes.Equal(got, payload) || m.Size != int64(len(payload)) || m.Attrs["peer"] != "node-b" {
		t.Fatalf("got %d bytes, meta %+v, err %v", len(got), m, err)
	}
	if _, _, err := fetch(client, a, "node-a", "missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing blob: %v", err)
	}
	// The server must be the node asked for: node-a's certificate does
	// not pass for node-c.
	if _, _, err := fetch(client, a, "node-c", "x"); !errors.Is(err, ErrUnreachable) && !errors.Is(err, ErrRefused) {
		t.Fatalf("node-a answered as node-c: %v", err)
	}

	// Rotation: the clock moves past half a node certificate's life and
	// then into the last third of the authority's. Every node keeps
	// trusting every node, through the rollover.
	now := time.Now()
	clock := func() time.Time { return now }
	a.creds.Now, b.Now = clock, clock
	first := b.Expiry()
	now = now.Add(13 * time.Hour)
	for _, c := range []*Credentials{a.creds, b} {
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if !b.Expiry().After(first) {
		t.Fatalf("node certificate not renewed at half its life: %v then %v", first, b.Expiry())
	}
	data, _, _ := store.Load(context.Background())
	old, _, _ := ParseAuthority(data, now)
	// An hour before the authority's last third both renew as Run does;
	// two hours later b is first to refresh and rolls it over.
	now = old[0].NotAfter.Add(-DefaultAuthorityLifetime/3 - time.Hour)
	for _, c := range []*Credentials{a.creds, b} {
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(2 * time.Hour)
	if err := b.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, _, _ = store.Load(context.Background())
	cas, _, _ := ParseAuthority(data, now)
	if len(cas) != 2 || !cas[1].Equal(old[0]) {
		t.Fatalf("after rollover the store holds %d authorities", len(cas))
	}
	// b keeps presenting its certificate from the old authority until the
	// new one has had time to reach every node, so a, which has not
	// refreshed yet, still trusts it.
	if got, _, err := fetch(client, a, "node-a", "x"); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("right after the rollover, before a refreshed: %d bytes, %v", len(got), err)
	}
	if err := a.creds.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	now = now.Add(Propagation + 6*time.Minute)
	before := b.Expiry()
	for _, c := range []*Credentials{a.creds, b} {
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if !b.Expiry().After(before) {
		t.Fatal("b's certificate was not moved to the new authority after the propagation time")
	}
	if got, _, err := fetch(client, a, "node-a", "x"); err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("after rollover: %d bytes, %v", len(got), err)
	}
}

// An attacker's attempts each get nothing, and the server keeps serving.
func TestTransferRefusesAttackers(t *testing.T) {
	store := &MemoryStore{}
	src := &fakeSource{blobs: map[string][]byte{"x": []byte("secret data")}}
	a := startNode(t, store, "node-a", src, func(s *Server) {
		s.HeaderTimeout = time.Second
		s.MaxStreams = 1
		s.StallTimeout = 500 * time.Millisecond
	})
	good := &Credentials{Store: store, Driver: driver, Node: "node-b"}
	if err := good.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	goodClient := &Client{Creds: good}
	data, _, _ := store.Load(context.Background())
	cas, caKey, err := ParseAuthority(data, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots, _, _ := good.current()

	// withCert dials node-a with a client certificate of the attacker's
	// making (nil: none) and sends raw.
	withCert := func(cert *tls.Certificate, raw string) (string, error) {
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "node-a"}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		conn, err := tls.Dial("tcp", a.addr, cfg)
		if err != nil {
			return "", err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, raw); err != nil {
			return "", err
		}
		b, err := io.ReadAll(conn)
		return string(b), err
	}
	get := func(path string) string {
		return "GET " + path + " HTTP/1.1\r\nHost: node-a\r\nConnection: close\r\n\r\n"
	}
	otherCluster := &Credentials{Store: &MemoryStore{}, Driver: driver, Node: "node-b"}
	if err := otherCluster.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, otherLeaf, _ := otherCluster.current()
	expired, err := IssueLeaf(cas[0], caKey, driver, "node-b", time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	otherDriver, err := IssueLeaf(cas[0], caKey, "other.csi", "node-b", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	_, goodLeaf, _ := good.current()

	cases := []struct {
		name string
		try  func() (string, error)
		want string // a status line the server must answer with; "" means no HTTP answer at all
		// wantErr is in the error a refused handshake gives.
		wantErr string
	}{
		{"no certificate", func() (string, error) { return withCert(nil, get("/v1/"+driver+"/blob/x")) }, "", "tls: certificate required"},
		{"plain HTTP from a pod on the node network", func() (string, error) {
			conn, err := net.Dial("tcp", a.addr)
			if err != nil {
				return "", err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(conn, get("/v1/"+driver+"/blob/x"))
			b, err := io.ReadAll(conn)
			return string(b), err
		}, "HTTP/1.0 400", ""}, // Go's "client sent an HTTP request to an HTTPS server"
		{"another cluster's authority", func() (string, error) { return withCert(otherLeaf, get("/v1/"+driver+"/blob/x")) }, "", "tls: unknown certificate authority"},
		{"an expired certificate", func() (string, error) { return withCert(expired, get("/v1/"+driver+"/blob/x")) }, "", "tls: expired certificate"},
		{"a certificate of another driver", func() (string, error) { return withCert(otherDriver, get("/v1/"+driver+"/blob/x")) }, "HTTP/1.1 403", ""},
		{"a source of another driver name", func() (string, error) { return withCert(goodLeaf, get("/v1/other.csi/blob/x")) }, "HTTP/1.1 403", ""},
		{"an id that escapes", func() (string, error) { return withCert(goodLeaf, get("/v1/"+driver+"/blob/..%2f..%2fetc%2fpasswd")) }, "HTTP/1.1 400", ""},
		{"a path that escapes", func() (string, error) { return withCert(goodLeaf, get("/v1/"+driver+"/blob/x/../../../etc/passwd")) }, "HTTP/1.1 400", ""},
		{"a request with a body", func() (string, error) {
			return withCert(goodLeaf, "GET /v1/"+driver+"/blob/x HTTP/1.1\r\nHost: node-a\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
		}, "HTTP/1.1 400", ""},
		{"a method that writes", func() (string, error) {
			return withCert(goodLeaf, "PUT /v1/"+driver+"/blob/x HTTP/1.1\r\nHost: node-a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		}, "HTTP/1.1 405", ""},
		{"an oversized header", func() (string, error) {
			return withCert(goodLeaf, "GET /v1/"+driver+"/blob/x HTTP/1.1\r\nHost: node-a\r\nX-Pad: "+strings.Repeat("a", 64<<10)+"\r\n\r\n")
		}, "HTTP/1.1 431", ""},
		{"an endless header", func() (string, error) {
			// Drips a header that never ends: closed after HeaderTimeout.
			cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "node-a", Certificates: []tls.Certificate{*goodLeaf}}
			conn, err := tls.Dial("tcp", a.addr, cfg)
			if err != nil {
				return "", err
			}
			defer conn.Close()
			start := time.Now()
			io.WriteString(conn, "GET /v1/"+driver+"/blob/x HTTP/1.1\r\n")
			for time.Since(start) < 5*time.Second {
				if _, err := io.WriteString(conn, "X-A: b\r\n"); err != nil {
					return "closed after " + time.Since(start).Round(100*time.Millisecond).String(), nil
				}
				time.Sleep(100 * time.Millisecond)
			}
			return "still open after 5s", nil
		}, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := src.opened.Load()
			out, err := c.try()
			if c.want == "" && strings.HasPrefix(out, "HTTP/") || c.want != "" && !strings.HasPrefix(out, c.want) {
				t.Fatalf("answer %.80q (err %v), want %q", out, err, c.want)
			}
			if c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("error %v, want one with %q", err, c.wantErr)
			}
			if strings.Contains(out, "secret data") || src.opened.Load() != before {
				t.Fatalf("the source was opened: %.200q", out)
			}
			if strings.HasPrefix(out, "still open") {
				t.Fatal(out)
			}
			// The server keeps serving.
			if got, _, err := fetch(goodClient, a, "node-a", "x"); err != nil || string(got) != "secret data" {
				t.Fatalf("after the attempt a good peer got %q, %v", got, err)
			}
		})
	}

	t.Run("a replayed session", func(t *testing.T) {
		// Record what a good client sends in a whole session, then send
		// the same bytes again: TLS 1.3's fresh handshake secrets make
		// them useless, and the source is not opened again.
		rec := &recorder{}
		proxied := &node{addr: proxy(t, a.addr, func(client, up net.Conn) {
			go io.Copy(client, up)
			io.Copy(io.MultiWriter(up, rec), client)
		})}
		if got, _, err := fetch(goodClient, proxied, "node-a", "x"); err != nil || string(got) != "secret data" {
			t.Fatalf("through the recorder: %q, %v", got, err)
		}
		before := src.opened.Load()
		conn, err := net.Dial("tcp", a.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(rec.bytes())
		out, _ := io.ReadAll(conn)
		if bytes.Contains(out, []byte("secret data")) || src.opened.Load() != before {
			t.Fatalf("the replay was served (%d bytes back)", len(out))
		}
	})

	t.Run("a peer that stops reading", func(t *testing.T) {
		big := &fakeSource{blobs: map[string][]byte{"big": bytes.Repeat([]byte{1}, 64<<20)}}
		b := startNode(t, store, "node-c", big, func(s *Server) { s.StallTimeout = 300 * time.Millisecond })
		m, rc, err := goodClient.Open(context.Background(), b.addr, "node-c", "blob", "big", false)
		if err != nil || m.Size != 64<<20 {
			t.Fatal(m, err)
		}
		defer rc.Close()
		rc.Read(make([]byte, 1))
		deadline := time.Now().Add(10 * time.Second)
		for big.open.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if big.open.Load() != 0 {
			t.Fatal("a stalled stream still holds its source")
		}
		if _, err := io.Copy(io.Discard, rc); !errors.Is(err, ErrIncomplete) {
			t.Fatalf("the stalled stream read on to %v, want ErrIncomplete", err)
		}
	})

	t.Run("more streams than allowed", func(t *testing.T) {
		src.block = make(chan struct{})
		defer func() { src.block = nil }()
		first := make(chan error, 1)
		go func() { _, _, err := fetch(goodClient, a, "node-a", "x"); first <- err }()
		for src.open.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		_, _, err := fetch(goodClient, a, "node-a", "x")
		close(src.block)
		if !errors.Is(err, ErrBusy) {
			t.Fatalf("second stream: %v, want ErrBusy", err)
		}
		if err := <-first; err != nil {
			t.Fatal(err)
		}
	})
}

type recorder struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b.Write(p)
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.b.Bytes())
}

// A stream cut half-way, or with a changed trailer, is ErrIncomplete.
func TestTransferCutStream(t *testing.T) {
	store := &MemoryStore{}
	payload := bytes.Repeat([]byte("abc"), 1<<20)
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": payload}}, nil)
	b := &Credentials{Store: store, Driver: driver, Node: "node-b"}
	if err := b.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A proxy that passes the first 1 MiB of the answer and then cuts.
	cut := proxy(t, a.addr, func(client, up net.Conn) {
		go io.Copy(up, client)
		io.CopyN(client, bufio.NewReader(up), 1<<20)
	})
	_, _, err := fetch(&Client{Creds: b}, &node{addr: cut}, "node-a", "x")
	if !errors.Is(err, ErrIncomplete) {
		t.Fatalf("cut stream: %v, want ErrIncomplete", err)
	}
}

// proxy accepts one connection, dials target and hands both to relay,
// closing them when it returns. It returns the address to dial.
func proxy(t *testing.T, target string, relay func(client, up net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		up, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer up.Close()
		relay(c, up)
	}()
	return ln.Addr().String()
}
