package transfer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestTransferSurvivesUnauthenticatedFlood: connections that never finish
// a TLS handshake (idle, or a ClientHello cut short), from one pod's
// address and from many, kept open and reopened as they are closed, do
// not keep a peer's restore from its data: the peer's fetches succeed,
// none waiting for an attacker's handshake deadline (30 s here, so that a
// fetch slowed by a busy machine is never mistaken for one that waited).
// In the first version 64 idle connections took every connection slot
// for 10 s each.
func TestTransferSurvivesUnauthenticatedFlood(t *testing.T) {
	store := &MemoryStore{}
	payload := bytes.Repeat([]byte("restore me "), 100000)
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": payload}}, func(s *Server) {
		s.HandshakeTimeout = 30 * time.Second
	})
	good := &Credentials{Store: store, Driver: driver, Node: "node-b"}
	if err := good.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	client := &Client{Creds: good}
	_, port, _ := net.SplitHostPort(a.addr)

	for _, tc := range []struct {
		name  string
		first byte // the first source address, 127.0.0.first
		peers int  // source addresses from there
		each  int  // connections each keeps open
		hello bool
	}{
		{"one pod, idle", 2, 1, 300, false},
		{"one pod, a ClientHello cut short", 2, 1, 300, true},
		{"many pods", 2, 60, 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open, stop := testutil.FloodFrom(net.JoinHostPort("127.0.0.1", port), tc.first, tc.peers, tc.each, tc.hello)
			defer stop()
			time.Sleep(500 * time.Millisecond) // the flood is on
			n := open()
			if n < int64(min(8, tc.each)) {
				t.Fatalf("only %d attacking connections open", n)
			}
			for i := range 5 {
				start := time.Now()
				got, _, err := fetch(client, a, "node-a", "x")
				if err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("fetch %d under the flood (%d connections): %d bytes, %v", i, n, len(got), err)
				}
				if took := time.Since(start); took > 10*time.Second {
					t.Fatalf("fetch %d under the flood (%d connections) took %v: it waited for attackers' handshakes", i, n, took)
				}
			}
			t.Logf("%d attacking connections open; 5 fetches of %d bytes served", n, len(payload))
		})
	}
}

// TestTransferIdlePodBehindThePeersAddress: where pods' traffic is
// masqueraded behind their node's address, a pod that holds that
// address's 8 pending slots with idle connections no longer cuts the
// node's driver off: a newcomer evicts the oldest idle one. Before, the
// driver was refused until the pod's connections timed out, and the pod
// opened them again.
func TestTransferIdlePodBehindThePeersAddress(t *testing.T) {
	store := &MemoryStore{}
	payload := []byte("restore me")
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": payload}}, func(s *Server) {
		s.HandshakeTimeout = 10 * time.Second
	})
	client := &Client{Creds: nodeCreds(t, store, "node-b", 0)}
	for range 8 {
		c, err := net.Dial("tcp", a.addr) // from 127.0.0.1, as the client
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	time.Sleep(2500 * time.Millisecond) // past a tenth of the deadline: idle, with room for a slow accept
	for i := range 3 {
		if got, _, err := fetch(client, a, "node-a", "x"); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("fetch %d beside an idle pod's 8 connections: %q %v", i, got, err)
		}
	}
}

// TestTransferOneNodeCannotHoldEverySlot: a node with a valid certificate
// that opens 64 authenticated connections and leaves them idle holds at
// most its 8; another node's fetches go on, well inside the handshake
// deadline (30 s). Before, it held all 64 authenticated slots and every
// other node waited out that deadline and was closed.
func TestTransferOneNodeCannotHoldEverySlot(t *testing.T) {
	store := &MemoryStore{}
	payload := []byte("restore me")
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": payload}}, func(s *Server) {
		s.HandshakeTimeout = 30 * time.Second
	})
	hog, good := nodeCreds(t, store, "node-c", 0), nodeCreds(t, store, "node-b", 0)
	roots, leaf, err := hog.current()
	if err != nil {
		t.Fatal(err)
	}
	var conns []*tls.Conn
	for range 64 {
		c, err := tls.Dial("tcp", a.addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "node-a",
			Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	// The server closes those beyond node-c's share (EOF); the ones it
	// holds time out. All are read at once, with room for a busy machine.
	timedOut := make(chan bool, len(conns))
	for _, c := range conns {
		go func() {
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			timedOut <- errors.As(err, &ne) && ne.Timeout()
		}()
	}
	held := 0
	for range conns {
		if <-timedOut {
			held++
		}
	}
	if held > 8 {
		t.Fatalf("node-c holds %d authenticated connections, more than its 8", held)
	}
	client := &Client{Creds: good}
	for i := range 3 {
		start := time.Now()
		if got, _, err := fetch(client, a, "node-a", "x"); err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("node-b's fetch %d beside node-c's %d idle connections: %q %v", i, held, got, err)
		} else if took := time.Since(start); took > 10*time.Second {
			t.Fatalf("node-b's fetch %d took %v", i, took)
		}
	}
}

// TestTransferClosesRefusedConnections: a refused request's connection
// is closed with its answer, so a peer refused over and over holds no
// authenticated slot between its tries.
func TestTransferClosesRefusedConnections(t *testing.T) {
	store := &MemoryStore{}
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": []byte("x")}}, func(s *Server) {
		s.Authorizer = AuthorizerFunc(func(context.Context, string, string, string) error { return ErrRefused })
	})
	roots, leaf, err := nodeCreds(t, store, "node-b", 0).current()
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", a.addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "node-a",
		Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /v1/%s/blob/x HTTP/1.1\r\nHost: node-a\r\n\r\n", driver)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	answer, err := io.ReadAll(c) // ends only when the server closes
	if err != nil {
		t.Fatalf("the connection stayed open after a refusal: %v (%q)", err, answer)
	}
	if !bytes.HasPrefix(answer, []byte("HTTP/1.1 403")) {
		t.Fatalf("answer %q", answer)
	}
}
