package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// handshake runs a TLS handshake of client against a listener with
// server's config, and returns the client's error and the server's.
func handshake(t *testing.T, server, client *tls.Config) (error, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc.Handshake()
		if err == nil {
			// TLS 1.3: the client's certificate is checked after the
			// client's handshake ends; a read shows the server's verdict.
			tc.Write([]byte("x"))
		}
		srvErr <- err
	}()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), client)
	if err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	return err, <-srvErr
}

// TestControlChannel: a node's control endpoint admits the controller of
// its driver and no node, and the controller talks only to the node it
// dialled; the controller's certificate is no node's, for the transfer
// server either.
func TestControlChannel(t *testing.T) {
	store := &MemoryStore{}
	a := nodeCreds(t, store, "node-a", 0)
	b := nodeCreds(t, store, "node-b", 0)
	ctrl := nodeCreds(t, store, ControllerPeer, 0)
	foreign := &Credentials{Store: &MemoryStore{}, Driver: driver, Node: ControllerPeer}
	if err := foreign.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	otherDriver := &Credentials{Store: store, Driver: "other.csi", Node: ControllerPeer}
	if err := otherDriver.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, leaf, _ := ctrl.current()
	if len(leaf.Leaf.DNSNames)+len(leaf.Leaf.IPAddresses) != 0 || len(leaf.Leaf.ExtKeyUsage) != 1 {
		t.Fatalf("the controller's certificate names %v %v, usages %v: want no server names, client use only", leaf.Leaf.DNSNames, leaf.Leaf.IPAddresses, leaf.Leaf.ExtKeyUsage)
	}
	for _, tc := range []struct {
		name       string
		server     *Credentials
		client     *tls.Config
		ok         bool
		refusedBy  string
		refusalHas string
	}{
		{"the controller to the node it dials", a, ctrl.ControlClientConfig("node-a"), true, "", ""},
		{"the controller to another node than it meant", b, ctrl.ControlClientConfig("node-a"), false, "client", "node-a"},
		{"a node as a client", a, b.ControlClientConfig("node-a"), false, "server", "not the controller"},
		{"a controller of another authority", a, foreign.ControlClientConfig("node-a"), false, "", ""},
		{"the controller of another driver", a, otherDriver.ControlClientConfig("node-a"), false, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cerr, serr := handshake(t, tc.server.ControlServerConfig(), tc.client)
			if tc.ok {
				if cerr != nil || serr != nil {
					t.Fatalf("client %v, server %v; want a connection", cerr, serr)
				}
				return
			}
			if cerr == nil && serr == nil {
				t.Fatal("connected; want a refusal")
			}
			switch tc.refusedBy {
			case "client":
				if cerr == nil || !strings.Contains(cerr.Error(), tc.refusalHas) {
					t.Fatalf("client %v; want its refusal naming %q", cerr, tc.refusalHas)
				}
			case "server":
				if serr == nil || !strings.Contains(serr.Error(), tc.refusalHas) {
					t.Fatalf("server %v; want its refusal naming %q", serr, tc.refusalHas)
				}
			}
		})
	}

	// The transfer server serves nodes only.
	n := startNode(t, store, "node-a", &fakeSource{blobs: map[string][]byte{"x": []byte("data")}}, nil)
	_, _, err := fetch(&Client{Creds: ctrl}, n, "node-a", "x")
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("the controller fetching a node's source: %v, want ErrRefused", err)
	}
}

// TestControllerRequest: the controller's certificate request is checked
// as its own, and no node's passes for it.
func TestControllerRequest(t *testing.T) {
	_, der, err := NewRequest(driver, ControllerPeer)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CheckRequest(der, driver, ControllerPeer); err != nil {
		t.Fatalf("the controller's own request: %v", err)
	}
	if _, err := CheckRequest(der, driver, "node-a"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("the controller's request checked as node-a's: %v", err)
	}
	_, node, err := NewRequest(driver, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CheckRequest(node, driver, ControllerPeer); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("node-a's request checked as the controller's: %v", err)
	}
}
