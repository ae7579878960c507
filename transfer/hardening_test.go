package transfer

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// pathSource refuses with an error naming a host path, as a driver's
// source does when a volume's data is missing.
type pathSource struct{ *fakeSource }

func (p pathSource) Open(ctx context.Context, peer, kind, id string, statOnly bool) (Meta, io.ReadCloser, error) {
	switch id {
	case "gone":
		return Meta{}, nil, fmt.Errorf("%w: the data of volume gone is missing at /var/lib/csi-hostpath-data/volumes/gone", ErrNotFound)
	case "broken":
		return Meta{}, nil, fmt.Errorf("opening /var/lib/csi-hostpath-data/snapshots/broken.tar.gz: %w", os.ErrPermission)
	}
	return p.fakeSource.Open(ctx, peer, kind, id, statOnly)
}

// TestTransferHardening: a node named by an IP address transfers (its
// certificate has an IP SAN; the first version had a DNS SAN only, and
// no such node could ever be reached); sessions are never resumed (each
// connection checks the client's certificate against the authorities of
// now); refusals tell the peer their kind, never the serving node's
// paths; a stream from which nothing comes ends on the client's idle
// timeout; a reader slower than the rate floor is cut, so it cannot keep
// a source pinned for days.
func TestTransferHardening(t *testing.T) {
	store := &MemoryStore{}
	payload := bytes.Repeat([]byte("x"), 8<<20)
	small := bytes.Repeat([]byte("y"), 64<<10)
	src := &fakeSource{blobs: map[string][]byte{"x": payload, "small": small}}
	a := startNode(t, store, "10.1.2.3", src, func(s *Server) {
		s.Source = pathSource{src}
		s.StallTimeout, s.MinRate = 300*time.Millisecond, 4<<20
	})
	b := &Credentials{Store: store, Driver: driver, Node: "node-b"}
	if err := b.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Only the silent stream's client has a short idle timeout, and the
	// other fetches are small: a busy machine's pause of 300 ms must not
	// fail what is not about stalls.
	client := &Client{Creds: b}
	idle := &Client{Creds: b, IdleTimeout: 300 * time.Millisecond}

	t.Run("a node named by an IP address", func(t *testing.T) {
		got, _, err := fetch(client, a, "10.1.2.3", "small")
		if err != nil || !bytes.Equal(got, small) {
			t.Fatalf("%d bytes, %v", len(got), err)
		}
	})

	t.Run("no session resumption", func(t *testing.T) {
		roots, leaf, _ := b.current()
		cache := tls.NewLRUClientSessionCache(4)
		for i := range 2 {
			c, err := tls.Dial("tcp", a.addr, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "10.1.2.3",
				Certificates: []tls.Certificate{*leaf}, ClientSessionCache: cache})
			if err != nil {
				t.Fatal(err)
			}
			// A ticket, if the server sent one, arrives after the
			// handshake: read until the server closes the connection.
			c.Write([]byte("GET /v1/" + driver + "/blob/missing HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"))
			io.ReadAll(c)
			resumed := c.ConnectionState().DidResume
			c.Close()
			if resumed {
				t.Fatalf("connection %d resumed a session", i+1)
			}
		}
	})

	t.Run("refusals name no path", func(t *testing.T) {
		for id, want := range map[string]error{"gone": ErrNotFound, "broken": nil} {
			_, _, err := fetch(client, a, "10.1.2.3", id)
			if err == nil || (want != nil && !errors.Is(err, want)) {
				t.Fatalf("%s: %v, want %v", id, err, want)
			}
			if strings.Contains(err.Error(), "/var/lib") {
				t.Fatalf("%s: the peer was told a path: %v", id, err)
			}
		}
	})

	t.Run("a stream from which nothing comes", func(t *testing.T) {
		src.block = make(chan struct{})
		defer func() { close(src.block); src.block = nil }()
		_, rc, err := idle.Open(context.Background(), a.addr, "10.1.2.3", "blob", "x", false)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		start := time.Now()
		_, err = io.Copy(io.Discard, rc)
		if !errors.Is(err, ErrIncomplete) || time.Since(start) > 5*time.Second {
			t.Fatalf("a silent stream: %v after %v, want ErrIncomplete at the idle timeout", err, time.Since(start))
		}
	})

	t.Run("a reader slower than the floor", func(t *testing.T) {
		slow := &Client{Creds: b}
		_, rc, err := slow.Open(context.Background(), a.addr, "10.1.2.3", "blob", "x", false)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		// 64 KiB every 50 ms is 1.25 MiB/s, under the 4 MiB/s floor, yet
		// every single write completes within the stall timeout.
		buf := make([]byte, 64<<10)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if _, err = rc.Read(buf); err != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !errors.Is(err, ErrIncomplete) {
			t.Fatalf("a slow reader read on: %v", err)
		}
		for src.open.Load() != 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if src.open.Load() != 0 {
			t.Fatal("the slow reader's stream still holds its source")
		}
	})
}
