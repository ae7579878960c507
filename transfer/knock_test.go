package transfer

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestKnock: a knock proves the certificate it carries to the node it
// names, within two minutes of its time, signed by that certificate's key
// under an authority the server trusts; anything else is refused.
func TestKnock(t *testing.T) {
	store := &MemoryStore{}
	server := nodeCreds(t, store, "node-a", 0)
	client := nodeCreds(t, store, "node-b", 0)
	stranger := nodeCreds(t, &MemoryStore{}, "node-b", 0) // another deployment's authority
	body := func(c *Credentials, to string) []byte {
		k, err := c.Knock(to)
		if err != nil {
			t.Fatal(err)
		}
		if string(k[:len(knockMagic)]) != knockMagic || int(binary.BigEndian.Uint16(k[len(knockMagic):])) != len(k)-len(knockMagic)-2 {
			t.Fatalf("a knock's framing: %q", k[:len(knockMagic)+2])
		}
		t.Logf("a knock of %s for %s: %d bytes", c.Node, to, len(k))
		return k[len(knockMagic)+2:]
	}
	// at is a knock of client's made at when.
	at := func(when time.Time) []byte {
		client.Now = func() time.Time { return when }
		defer func() { client.Now = nil }()
		return body(client, "node-a")
	}
	tampered := body(client, "node-a")
	tampered[len(tampered)-1] ^= 1
	for _, c := range []struct {
		name string
		body []byte
		want string // the peer proved, "" for a refusal
	}{
		{"a knock for this node", body(client, "node-a"), "node-b"},
		{"a knock for another node", body(client, "node-c"), ""},
		{"a minute old", at(time.Now().Add(-time.Minute)), "node-b"},
		{"three minutes old", at(time.Now().Add(-3 * time.Minute)), ""},
		{"three minutes ahead", at(time.Now().Add(3 * time.Minute)), ""},
		{"a signature altered", tampered, ""},
		{"another authority's certificate", body(stranger, "node-a"), ""},
		{"cut short", body(client, "node-a")[:40], ""},
		{"empty", nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := server.verifyKnock(c.body)
			if c.want == "" {
				if err == nil {
					t.Fatalf("taken as %q", got)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("%q, %v; want %q", got, err, c.want)
			}
		})
	}
}

// TestTransferFromThePeersOwnAddress: a pod masqueraded behind its node's
// address (the flood comes from the client's own address, 127.0.0.1)
// that holds and reopens hundreds of connections, idle or with a
// ClientHello cut short, no longer keeps that node's driver from its
// pulls: its connections knock, and take slots no flood can. Before, 3
// fetches of 5 failed (the address's 8 pending slots churned by the
// flood); the handshake deadline here is 30 s, so a fetch that waited
// for the flood's connections would take that long.
func TestTransferFromThePeersOwnAddress(t *testing.T) {
	store := &MemoryStore{}
	payload := bytes.Repeat([]byte("restore me "), 100000)
	a := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": payload}}, func(s *Server) {
		s.HandshakeTimeout = 30 * time.Second
	})
	client := &Client{Creds: nodeCreds(t, store, "node-b", 0)}
	_, port, _ := net.SplitHostPort(a.addr)
	for _, hello := range []bool{false, true} {
		open, stop := testutil.FloodFrom(net.JoinHostPort("127.0.0.1", port), 1, 1, 300, hello)
		time.Sleep(500 * time.Millisecond) // the flood is on
		for i := range 5 {
			start := time.Now()
			got, _, err := fetch(client, a, "node-a", "x")
			if err != nil || !bytes.Equal(got, payload) {
				stop()
				t.Fatalf("fetch %d beside %d connections from the same address (ClientHello cut short: %v): %d bytes, %v", i, open(), hello, len(got), err)
			}
			if took := time.Since(start); took > 10*time.Second {
				stop()
				t.Fatalf("fetch %d beside %d connections from the same address took %v", i, open(), took)
			}
		}
		t.Logf("5 fetches of %d bytes beside %d connections from the same address (ClientHello cut short: %v)", len(payload), open(), hello)
		stop()
	}
}

// TestKnockToAServerOfBefore: a server of the previous release reads a
// knock as a broken TLS handshake; the client dials again without one and
// is served.
func TestKnockToAServerOfBefore(t *testing.T) {
	store := &MemoryStore{}
	payload := []byte("served without a knock")
	a := nodeCreds(t, store, "node-a", 0)
	srv := &Server{Creds: a, Source: &fakeSource{blobs: map[string][]byte{"x": payload}}, Authorizer: AllowAll}
	srv.init()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Its TLS listener, as the previous release's gate did: no knocks.
	hs := &http.Server{Handler: srv}
	go hs.Serve(tls.NewListener(raw, srv.tlsConfig()))
	t.Cleanup(func() { hs.Close() })
	client := &Client{Creds: nodeCreds(t, store, "node-b", 0)}
	m, rc, err := client.Open(context.Background(), raw.Addr().String(), "node-a", "blob", "x", false)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got bytes.Buffer
	if _, err := got.ReadFrom(rc); err != nil || !bytes.Equal(got.Bytes(), payload) || m.Size != int64(len(payload)) {
		t.Fatalf("%q, %v", got.Bytes(), err)
	}
}
