package transfer

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestTransferSurvivesUnauthenticatedFlood: connections that never finish
// a TLS handshake (idle, or a ClientHello cut short), from one pod's
// address and from many, kept open and reopened as they are closed, do
// not keep a peer's restore from its data: the peer's fetches succeed at
// once, none waiting for an attacker's handshake deadline. In the first
// version 64 idle connections took every connection slot for 10 s each.
func TestTransferSurvivesUnauthenticatedFlood(t *testing.T) {
	store := &MemoryStore{}
	payload := bytes.Repeat([]byte("restore me "), 100000)
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": payload}}, func(s *Server) {
		s.HandshakeTimeout = 2 * time.Second
	})
	good := &Credentials{Store: store, Driver: driver, Node: "node-b"}
	if err := good.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	client := &Client{Creds: good}
	_, port, _ := net.SplitHostPort(a.addr)

	for _, tc := range []struct {
		name  string
		peers int // source addresses 127.0.0.2 onwards
		each  int // connections each keeps open
		hello bool
	}{
		{"one pod, idle", 1, 300, false},
		{"one pod, a ClientHello cut short", 1, 300, true},
		{"many pods", 60, 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open, stop := testutil.Flood(net.JoinHostPort("127.0.0.1", port), tc.peers, tc.each, tc.hello)
			defer stop()
			time.Sleep(500 * time.Millisecond) // the flood is on
			n := open()
			if n < 8 {
				t.Fatalf("only %d attacking connections open", n)
			}
			for i := range 5 {
				start := time.Now()
				got, _, err := fetch(client, a, "node-a", "x")
				if err != nil || !bytes.Equal(got, payload) {
					t.Fatalf("fetch %d under the flood (%d connections): %d bytes, %v", i, n, len(got), err)
				}
				if took := time.Since(start); took > 2*time.Second {
					t.Fatalf("fetch %d under the flood (%d connections) took %v: it waited for attackers' handshakes", i, n, took)
				}
			}
			t.Logf("%d attacking connections open; 5 fetches of %d bytes served", n, len(payload))
		})
	}
}
