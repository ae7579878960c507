package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// pendingFor authorizes node for the ids listed, and records what it was
// asked.
type pendingFor struct {
	mu    sync.Mutex
	allow map[string][]string // node -> ids
	asked []string
}

func (p *pendingFor) Authorize(_ context.Context, peer, kind, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, peer+" "+kind+"/"+id)
	for _, a := range p.allow[peer] {
		if a == id {
			return nil
		}
	}
	if id == "unanswerable" {
		return errors.New("the API server did not answer")
	}
	return fmt.Errorf("%w: no restore of %s pending on node %s", ErrRefused, id, peer)
}

// TestTransferAuthorizes: a server serves a source only to a peer its
// authorizer allows, refuses without one, and refuses a certificate made
// to last longer than a node's own, however it chains; the source is
// never opened for a refused peer.
func TestTransferAuthorizes(t *testing.T) {
	store := &MemoryStore{}
	blobs := map[string][]byte{"x": []byte("x's data"), "y": []byte("y's data"), "unanswerable": nil}
	authz := &pendingFor{allow: map[string][]string{"node-b": {"x"}}}
	src := &fakeSource{blobs: blobs}
	a := startNode(t, store, "node-a", src, func(s *Server) { s.Authorizer = authz })
	bare := startNode(t, store, "node-bare", &fakeSource{blobs: blobs}, func(s *Server) { s.Authorizer = nil })

	creds := func(name string) *Credentials {
		c := &Credentials{Store: store, Driver: driver, Node: name}
		if err := c.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		return c
	}
	b, c := creds("node-b"), creds("node-c")
	data, _, _ := store.Load(context.Background())
	cas, caKey, err := ParseAuthority(data, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// What anyone holding the authority's key can make: a certificate
	// naming node-b, good for a year.
	forged, err := IssueLeaf(cas[0], caKey, driver, "node-b", time.Now().Add(-time.Minute), time.Now().Add(365*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// As a node makes its own: the longest a server accepts.
	own, err := IssueLeaf(cas[0], caKey, driver, "node-b", time.Now().Add(-Backdate), time.Now().Add(DefaultLeafLifetime))
	if err != nil {
		t.Fatal(err)
	}
	withLeaf := func(leaf *tls.Certificate) *Client {
		lc := &Credentials{Store: store, Driver: driver, Node: "node-b"}
		if err := lc.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
		lc.mu.Lock()
		lc.leaf = leaf
		lc.mu.Unlock()
		return &Client{Creds: lc}
	}

	cases := []struct {
		name    string
		client  *Client
		server  *node
		id      string
		want    string // the data, or "" for a refusal
		wantErr error
		inMsg   string // in the refusal's message
	}{
		{"the node the source is being restored to", &Client{Creds: b}, a, "x", "x's data", nil, ""},
		{"that node, another source", &Client{Creds: b}, a, "y", "", ErrRefused, ErrRefused.Error()},
		{"a node with nothing pending", &Client{Creds: c}, a, "x", "", ErrRefused, ErrRefused.Error()},
		{"the authorizer cannot tell", &Client{Creds: b}, a, "unanswerable", "", nil, "driver's log says why"},
		{"a server without an authorizer", &Client{Creds: b}, bare, "x", "", ErrRefused, ErrRefused.Error()},
		{"a certificate of a node's own lifetime", withLeaf(own), a, "x", "x's data", nil, ""},
		{"a certificate made to last a year", withLeaf(forged), a, "x", "", ErrRefused, "longer than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := src.opened.Load()
			got, _, err := fetch(tc.client, tc.server, tc.server.creds.Node, tc.id)
			if tc.want != "" {
				if err != nil || string(got) != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.inMsg) {
				t.Fatalf("got %q, %v; want a refusal (%v) saying %q", got, err, tc.wantErr, tc.inMsg)
			}
			if src.opened.Load() != before {
				t.Fatal("the source was opened for a refused peer")
			}
		})
	}
	// The year-long certificate was refused before the authorizer was
	// asked: it was asked once for each other case that reached node-a.
	authz.mu.Lock()
	defer authz.mu.Unlock()
	want := "node-b blob/x,node-b blob/y,node-c blob/x,node-b blob/unanswerable,node-b blob/x"
	if got := strings.Join(authz.asked, ","); got != want {
		t.Fatalf("the authorizer was asked %s, want %s", got, want)
	}
}

// TestLifetimeCapsFollowTheNodesOwn: servers and clients alike refuse a
// peer certificate valid for longer than their own are made for: where a
// signer signs for 6 hours, a 24-hour certificate (what a node holding an
// authority's key makes itself) is refused both ways. Before, servers
// took up to 24 h 10 min whatever their own, and clients took any.
func TestLifetimeCapsFollowTheNodesOwn(t *testing.T) {
	store := &MemoryStore{}
	blob := &fakeSource{blobs: map[string][]byte{"x": []byte("x's data")}}
	signed := func(s *Server) { s.Creds = nodeCreds(t, store, "node-a", DefaultSignedLifetime) }
	a6 := startNode(t, store, "node-a", blob, signed)
	a24 := startNode(t, store, "node-a", blob, nil)
	creds := func(life time.Duration) *Client { return &Client{Creds: nodeCreds(t, store, "node-b", life)} }
	for _, c := range []struct {
		name   string
		client *Client
		server *node
		ok     bool
	}{
		{"6 h both ways", creds(DefaultSignedLifetime), a6, true},
		{"a 24 h client to a 6 h server", creds(DefaultLeafLifetime), a6, false},
		{"a 6 h client to a 24 h server", creds(DefaultSignedLifetime), a24, false},
	} {
		got, _, err := fetch(c.client, c.server, "node-a", "x")
		if c.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "longer than")) {
			t.Errorf("%s: %q %v", c.name, got, err)
		}
	}
}
