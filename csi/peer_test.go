package csi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/transfer"
)

// peerNode is one node's driver with its transfer server, as on a node of
// a cluster: its own node id and state dir, credentials from the shared
// store.
type peerNode struct {
	d     *Driver
	creds *transfer.Credentials
	addr  string
	halt  func() // stops the server while it runs
	// handshake is the server's HandshakeTimeout (zero: its default).
	handshake time.Duration
}

// stop takes the node's server down, as a node that is lost.
func (n *peerNode) stop() {
	if n.halt != nil {
		n.halt()
		n.halt = nil
	}
}

// serve starts the node's server, at its former address after a stop.
func (n *peerNode) serve(t *testing.T) {
	t.Helper()
	addr := n.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	n.addr = ln.Addr().String()
	srv := &transfer.Server{Creds: n.creds, Source: n.d.eng.TransferSource(), Authorizer: transfer.AllowAll, HandshakeTimeout: n.handshake}
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(c, ln) }()
	n.halt = func() { cancel(); <-done }
}

// countingPeers counts the bytes received and, when cutAt > 0, cuts each
// stream after that many.
type countingPeers struct {
	engine.Peers
	got   atomic.Int64
	cutAt int64
}

func (c *countingPeers) Open(ctx context.Context, tag, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, string, error) {
	m, rc, node, err := c.Peers.Open(ctx, tag, kind, id, statOnly)
	if rc != nil {
		rc = &countingReader{ReadCloser: rc, c: c}
	}
	return m, rc, node, err
}

type countingReader struct {
	io.ReadCloser
	c    *countingPeers
	read int64
}

func (r *countingReader) Read(b []byte) (int, error) {
	if r.c.cutAt > 0 && r.read+int64(len(b)) > r.c.cutAt {
		b = b[:max(0, r.c.cutAt-r.read)]
		if len(b) == 0 {
			return 0, fmt.Errorf("%w: cut by the test", transfer.ErrIncomplete)
		}
	}
	n, err := r.ReadCloser.Read(b)
	r.read += int64(n)
	r.c.got.Add(int64(n))
	return n, err
}

// newPeerPair starts two nodes' drivers that reach each other. Node a's
// state dir is stateA when given.
func newPeerPair(t *testing.T, stateA string) (a, b *peerNode, bPeers *countingPeers) {
	t.Helper()
	store := &transfer.MemoryStore{}
	nodes := map[string]*peerNode{}
	for _, name := range []string{"node-a", "node-b"} {
		cfg := testConfig(t)
		cfg.NodeID = name
		if name == "node-a" && stateA != "" {
			cfg.StateDir = stateA
		}
		n := &peerNode{d: newDriver(t, cfg), creds: &transfer.Credentials{Store: store, Driver: cfg.DriverName, Node: name}}
		t.Cleanup(func() { n.stop(); n.d.Close() })
		if err := n.creds.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		n.serve(t)
		nodes[name] = n
	}
	for name, n := range nodes {
		p := &transfer.Peers{Client: &transfer.Client{Creds: n.creds}, Resolve: func(_ context.Context, tag string) (string, string, error) {
			for other, o := range nodes {
				if engine.NodeTag(other) == tag && other != name {
					return o.addr, other, nil
				}
			}
			return "", "", fmt.Errorf("no node has tag %s", tag)
		}}
		cp := &countingPeers{Peers: p}
		n.d.eng.SetPeers(cp)
		if name == "node-b" {
			bPeers = cp
		}
	}
	return nodes["node-a"], nodes["node-b"], bPeers
}

func fromVolume(name, vol string, size int64) *csi.CreateVolumeRequest {
	r := createReq(name, size)
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol}}}
	return r
}

func asBlock(r *csi.CreateVolumeRequest) *csi.CreateVolumeRequest {
	r.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	return r
}

// nothingBuilt fails if node b holds any volume data, partial file or
// record after a failed pull.
func nothingBuilt(t *testing.T, d *Driver) {
	t.Helper()
	for _, dir := range []string{volumesDir(d), tmpDir(d)} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				t.Fatalf("a failed pull left %s in %s", e.Name(), dir)
			}
		}
	}
	if vs := allVolumes(d); len(vs) != 0 {
		t.Fatalf("a failed pull left records %v", vs)
	}
}

// TestRestoreAndCloneFromAnotherNode: node b builds volumes from node a's
// snapshots and volumes of every kind, the same bytes as a's, moving only
// data (holes stay holes on the wire); a transfer cut half-way leaves
// nothing on b and the retry succeeds; while a is down the answer is
// ResourceExhausted naming it, and the same request succeeds once a is
// back.
func TestRestoreAndCloneFromAnotherNode(t *testing.T) {
	a, b, bp := newPeerPair(t, filepath.Join(testfs.FileSystem(t, run, "btrfs", 2<<30, nil, ""), "state"))
	src := mustCreate(t, a.d, "src", 100<<20)
	srcDir := volumeDir(a.d, src.GetVolumeId())
	fillVolume(t, srcDir)
	blk := createBlock(t, a.d, "blk", 64<<20)
	blkFile := a.d.eng.VolumeDataPath(engine.VolumeRecord{ID: blk.GetVolumeId(), AccessType: engine.AccessBlock})
	pattern := bytes.Repeat([]byte("block data "), 100000) // ~1 MiB at two places
	f, err := os.OpenFile(blkFile, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(pattern, 0)
	f.WriteAt(pattern, 40<<20)
	f.Close()
	// The allocated image is 64 MiB of zeros and data: only what is not
	// zeros goes on the wire.

	snaps := map[string]string{}
	for name, params := range map[string]map[string]string{
		"tar.gz":  {engine.ParamFormat: engine.FormatTarGz},
		"tar.zst": {engine.ParamCompression: "zstd"},
		"reflink": {engine.ParamFormat: engine.FormatReflink},
	} {
		s, err := a.d.CreateSnapshot(ctx, snapReq("snap-"+name, src.GetVolumeId(), params))
		if err != nil {
			t.Fatal(name, err)
		}
		snaps[name] = s.GetSnapshot().GetSnapshotId()
	}
	bs, err := a.d.CreateSnapshot(ctx, snapReq("snap-blk", blk.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}

	sameBlock := func(t *testing.T, v *csi.Volume) {
		t.Helper()
		got, err := os.ReadFile(b.d.eng.VolumeDataPath(engine.VolumeRecord{ID: v.GetVolumeId(), AccessType: engine.AccessBlock}))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(blkFile)
		if len(got) != int(v.GetCapacityBytes()) || !bytes.Equal(got[:len(want)], want) {
			t.Fatalf("block volume on b: %d bytes, differs from a's %d", len(got), len(want))
		}
	}
	cases := []struct {
		name  string
		req   *csi.CreateVolumeRequest
		check func(t *testing.T, v *csi.Volume)
	}{
		{"directory snapshot tar.gz", fromSnapshot("r-gz", snaps["tar.gz"], 100<<20), nil},
		{"directory snapshot tar.zst", fromSnapshot("r-zst", snaps["tar.zst"], 100<<20), nil},
		{"reflink snapshot", fromSnapshot("r-reflink", snaps["reflink"], 100<<20), nil},
		{"directory volume", fromVolume("c-dir", src.GetVolumeId(), 100<<20), nil},
		{"block snapshot", asBlock(fromSnapshot("r-blk", bs.GetSnapshot().GetSnapshotId(), 96<<20)), sameBlock},
		{"block volume", asBlock(fromVolume("c-blk", blk.GetVolumeId(), 64<<20)), sameBlock},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := bp.got.Load()
			r, err := b.d.CreateVolume(ctx, c.req)
			if err != nil {
				t.Fatal(err)
			}
			v := r.GetVolume()
			t.Cleanup(func() { b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}) })
			if tag, _ := b.d.eng.OtherNode(v.GetVolumeId()); strings.Contains(tag, engine.NodeTag("node-a")) {
				t.Fatalf("volume %s was made with a's tag", v.GetVolumeId())
			}
			if c.check != nil {
				c.check(t, v)
			} else {
				sameTree(t, srcDir, volumeDir(b.d, v.GetVolumeId()))
			}
			if moved := bp.got.Load() - before; moved > 8<<20 {
				t.Fatalf("%d bytes moved for a few MiB of data: holes went on the wire", moved)
			}
			// Idempotent, without asking a again.
			a.stop()
			again, err := b.d.CreateVolume(ctx, c.req)
			a.serve(t)
			if err != nil || again.GetVolume().GetVolumeId() != v.GetVolumeId() {
				t.Fatalf("repeated request: %v, %v", again, err)
			}
		})
	}

	t.Run("a mount volume from a block snapshot", func(t *testing.T) {
		_, err := b.d.CreateVolume(ctx, fromSnapshot("wrong", bs.GetSnapshot().GetSnapshotId(), 100<<20))
		wantCode(t, err, codes.InvalidArgument)
	})
	t.Run("a snapshot a does not have", func(t *testing.T) {
		_, err := b.d.CreateVolume(ctx, fromSnapshot("none", engine.NewID(engine.SnapshotIDPrefix, engine.NodeTag("node-a")), 1<<20))
		wantCode(t, err, codes.NotFound)
	})
	t.Run("cut half-way, then retried", func(t *testing.T) {
		for _, req := range []*csi.CreateVolumeRequest{
			fromSnapshot("cut-dir", snaps["tar.gz"], 100<<20),
			asBlock(fromSnapshot("cut-blk", bs.GetSnapshot().GetSnapshotId(), 64<<20)),
		} {
			bp.cutAt = 100 // inside the smallest stream (the tar.gz is a few hundred bytes)
			_, err := b.d.CreateVolume(ctx, req)
			bp.cutAt = 0
			wantCode(t, err, codes.ResourceExhausted)
			nothingBuilt(t, b.d)
			r, err := b.d.CreateVolume(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: r.GetVolume().GetVolumeId()}); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("a down, then back", func(t *testing.T) {
		a.stop()
		req := fromSnapshot("while-down", snaps["tar.zst"], 100<<20)
		_, err := b.d.CreateVolume(ctx, req)
		wantCode(t, err, codes.ResourceExhausted)
		if !strings.Contains(err.Error(), "node-a") {
			t.Fatalf("the answer does not name the node: %v", err)
		}
		nothingBuilt(t, b.d)
		a.serve(t)
		r, err := b.d.CreateVolume(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: r.GetVolume().GetVolumeId()})
	})
}

// TestServeOnlyOwnSources: what a peer may ask a node for is one
// well-formed id of that node's; anything else is refused before a path
// is built.
func TestServeOnlyOwnSources(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "v", 1<<20)
	src := d.eng.TransferSource()
	for _, c := range []struct {
		kind, id string
		want     error
	}{
		{"volume", "../../etc/passwd", transfer.ErrInvalid},
		{"volume", "vol-" + strings.Repeat("a", 23) + "/", transfer.ErrInvalid},
		{"file", v.GetVolumeId(), transfer.ErrInvalid},
		{"snapshot", v.GetVolumeId(), transfer.ErrInvalid},
		{"volume", engine.NewID(engine.VolumeIDPrefix, engine.NodeTag("node-2")), transfer.ErrNotFound},
		{"volume", engine.NewID(engine.VolumeIDPrefix, engine.NodeTag("node-1")), transfer.ErrNotFound},
		{"snapshot", engine.NewID(engine.SnapshotIDPrefix, engine.NodeTag("node-1")), transfer.ErrNotFound},
	} {
		_, rc, err := src.Open(ctx, "node-2", c.kind, c.id, false)
		if !errors.Is(err, c.want) || rc != nil {
			t.Errorf("%s %q: %v, want %v", c.kind, c.id, err, c.want)
		}
	}
	m, rc, err := src.Open(ctx, "node-2", "volume", v.GetVolumeId(), false)
	if err != nil || m.Format != engine.WireTarZst || m.Attrs["access"] != engine.AccessMount {
		t.Fatal(m, err)
	}
	// While it is sent the volume is pinned: it cannot be deleted.
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
	if err == nil {
		t.Fatal("a volume being sent was deleted")
	}
	io.Copy(io.Discard, rc)
	rc.Close()
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
}
