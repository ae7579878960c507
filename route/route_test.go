package route

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/transfer"
)

const driverName = "route.test.csi"

var ctx = context.Background()

// testNode is one node's driver and its control endpoint.
type testNode struct {
	name string
	d    *hcsi.Driver
	addr string
	stop context.CancelFunc
	done chan struct{}
}

func creds(t *testing.T, store transfer.Store, who string) *transfer.Credentials {
	t.Helper()
	c := &transfer.Credentials{Store: store, Driver: driverName, Node: who}
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func startNode(t *testing.T, store transfer.Store, name string) *testNode {
	t.Helper()
	d, err := hcsi.New(engine.Config{DriverName: driverName, Version: "test", NodeID: name,
		StateDir: filepath.Join(t.TempDir(), "state"), MaxVolumeSize: 1 << 40, EnableVolumeExpansion: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(ctx)
	n := &testNode{name: name, d: d, addr: ln.Addr().String(), stop: cancel, done: make(chan struct{})}
	nc := creds(t, store, name)
	go func() { defer close(n.done); ServeNode(c, ln, nc, d, d.UnaryInterceptor()) }()
	t.Cleanup(func() { cancel(); <-n.done })
	return n
}

// serveAgain serves target as node n again, at n's address, after n was
// stopped, until the test ends.
func serveAgain(t *testing.T, store transfer.Store, n *testNode, target Target) {
	t.Helper()
	ln, err := net.Listen("tcp", n.addr)
	if err != nil {
		t.Fatal(err)
	}
	served, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ServeNode(served, ln, creds(t, store, n.name), target, n.d.UnaryInterceptor())
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// resolver is a Resolver over fixed nodes.
type resolver map[string]*testNode

func (r resolver) Resolve(_ context.Context, key string) (string, string, error) {
	n, ok := r[key]
	if !ok {
		return "", "", status.Error(codes.NotFound, "no node of the cluster runs the driver with key "+key)
	}
	return n.addr, n.name, nil
}

func (r resolver) Keys(context.Context) ([]string, error) {
	var keys []string
	for k := range r {
		keys = append(keys, k)
	}
	return keys, nil
}

func volume(t *testing.T, n *testNode, name string) string {
	t.Helper()
	mount := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	r, err := n.d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{mount},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetVolume().GetVolumeId()
}

// TestControllerRoutes: the controller's calls land on the node that
// holds what they name, over the control channel, and come back as the
// node answered; a group across nodes is refused naming them; a node
// down is Unavailable; the endpoint takes nothing but the routed calls
// and nobody but the controller.
func TestControllerRoutes(t *testing.T) {
	store := &transfer.MemoryStore{}
	a, b := startNode(t, store, "node-a"), startNode(t, store, "node-b")
	nodes := resolver{engine.NodeTag("node-a"): a, engine.NodeTag("node-b"): b}
	ctrlCreds := creds(t, store, transfer.ControllerPeer)
	c := &Controller{Name: driverName, Version: "test", Creds: ctrlCreds, Resolver: nodes, KeyOf: engine.KeyOf,
		Caps: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME}}
	defer c.Close()
	if r, err := c.Probe(ctx, &csi.ProbeRequest{}); err != nil || !r.GetReady().GetValue() {
		t.Fatalf("probe: %v %v", r, err)
	}
	unready := &Controller{Creds: &transfer.Credentials{Store: store, Driver: driverName, Node: transfer.ControllerPeer}}
	if r, err := unready.Probe(ctx, &csi.ProbeRequest{}); err != nil || r.GetReady().GetValue() {
		t.Fatalf("probe without a certificate: %v %v, want not ready", r, err)
	}
	// Ready holds Probe back until it answers (the API server reachable).
	c.Ready = func(context.Context) error { return errors.New("the API server does not answer") }
	if r, err := c.Probe(ctx, &csi.ProbeRequest{}); err != nil || r.GetReady().GetValue() {
		t.Fatalf("probe while Ready fails: %v %v, want not ready", r, err)
	}
	c.Ready = nil
	va, va2, vb := volume(t, a, "pvc-a"), volume(t, a, "pvc-a2"), volume(t, b, "pvc-b")

	snaps := map[string]string{}
	for _, tc := range []struct{ name, vol, node string }{{"snap-of-a", va, "node-a"}, {"snap-of-a2", va2, "node-a"}, {"snap-of-b", vb, "node-b"}} {
		r, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: tc.name, SourceVolumeId: tc.vol})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		id := r.GetSnapshot().GetSnapshotId()
		if key, _ := engine.KeyOf(id); key != engine.NodeTag(tc.node) || !r.GetSnapshot().GetReadyToUse() {
			t.Fatalf("%s: snapshot %s, ready %v: want one made on %s", tc.name, id, r.GetSnapshot().GetReadyToUse(), tc.node)
		}
		snaps[tc.name] = id
	}
	// The same name again: the node's own idempotence.
	if r, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-of-b", SourceVolumeId: vb}); err != nil || r.GetSnapshot().GetSnapshotId() != snaps["snap-of-b"] {
		t.Fatalf("snap-of-b again: %v %v", r, err)
	}

	t.Run("list", func(t *testing.T) {
		r, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: snaps["snap-of-b"]})
		if err != nil || len(r.GetEntries()) != 1 || r.GetEntries()[0].GetSnapshot().GetSourceVolumeId() != vb {
			t.Fatalf("by id: %v %v", r, err)
		}
		r, err = c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: va2})
		if err != nil || len(r.GetEntries()) != 1 || r.GetEntries()[0].GetSnapshot().GetSnapshotId() != snaps["snap-of-a2"] {
			t.Fatalf("by source: %v %v", r, err)
		}
		if r, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: "not-ours"}); err != nil || len(r.GetEntries()) != 0 {
			t.Fatalf("an id of no node: %v %v", r, err)
		}
		for _, max := range []int32{0, 1, 2, 3, 5} {
			var got []string
			token := ""
			for pages := 0; ; pages++ {
				if pages > 10 {
					t.Fatalf("max %d: more pages than snapshots", max)
				}
				r, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: max, StartingToken: token})
				if err != nil {
					t.Fatalf("max %d, token %q: %v", max, token, err)
				}
				if max > 0 && int32(len(r.GetEntries())) > max {
					t.Fatalf("max %d: a page of %d", max, len(r.GetEntries()))
				}
				for _, e := range r.GetEntries() {
					got = append(got, e.GetSnapshot().GetSnapshotId())
				}
				if token = r.GetNextToken(); token == "" {
					break
				}
			}
			want := []string{snaps["snap-of-a"], snaps["snap-of-a2"], snaps["snap-of-b"]}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("max %d: listed %v, want every node's %v", max, got, want)
			}
		}
	})

	t.Run("expand", func(t *testing.T) {
		r, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: vb, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}})
		if err != nil || r.GetCapacityBytes() < 64<<20 {
			t.Fatalf("%v %v", r, err)
		}
		if _, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "vol-nothing", CapacityRange: &csi.CapacityRange{RequiredBytes: 1}}); status.Code(err) != codes.NotFound {
			t.Fatalf("a volume id of no node: %v, want NotFound", err)
		}
	})

	t.Run("groups", func(t *testing.T) {
		_, err := c.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "across", SourceVolumeIds: []string{va, vb}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "must all be on one node") || !strings.Contains(err.Error(), "node node-a") || !strings.Contains(err.Error(), "node node-b") {
			t.Fatalf("a group across two nodes: %v, want InvalidArgument naming both", err)
		}
		r, err := c.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "one-node", SourceVolumeIds: []string{va, va2}})
		if err != nil || len(r.GetGroupSnapshot().GetSnapshots()) != 2 {
			t.Fatalf("a group on one node: %v %v", r, err)
		}
		id := r.GetGroupSnapshot().GetGroupSnapshotId()
		var ids []string
		for _, s := range r.GetGroupSnapshot().GetSnapshots() {
			ids = append(ids, s.GetSnapshotId())
		}
		if g, err := c.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: id, SnapshotIds: ids}); err != nil || g.GetGroupSnapshot().GetGroupSnapshotId() != id {
			t.Fatalf("get: %v %v", g, err)
		}
		for i := 0; i < 2; i++ {
			if _, err := c.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: id, SnapshotIds: ids}); err != nil {
				t.Fatalf("delete %d: %v", i, err)
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			if _, err := c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snaps["snap-of-a"]}); err != nil {
				t.Fatalf("delete %d: %v", i, err)
			}
		}
		if r, _ := a.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: snaps["snap-of-a"]}); len(r.GetEntries()) != 0 {
			t.Fatal("the snapshot is still on its node")
		}
		if _, err := c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "garbage"}); err != nil {
			t.Fatalf("an id this driver never makes: %v, want success", err)
		}
	})

	t.Run("only the routed calls, only from the controller", func(t *testing.T) {
		dial := func(cr *transfer.Credentials) csi.ControllerClient {
			cc, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(credentials.NewTLS(cr.ControlClientConfig("node-a"))))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cc.Close() })
			return csi.NewControllerClient(cc)
		}
		_, err := dial(ctrlCreds).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: va})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("DeleteVolume on the control endpoint: %v, want PermissionDenied", err)
		}
		if _, err := a.d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: va}); err != nil {
			t.Fatal(err)
		}
		_, err = dial(creds(t, store, "node-b")).ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("a node calling another's control endpoint: %v, want its connection refused", err)
		}
	})

	t.Run("a node down", func(t *testing.T) {
		b.stop()
		<-b.done
		_, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "while-down", SourceVolumeId: vb})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "node-b") {
			t.Fatalf("a snapshot of a volume whose node is down: %v, want Unavailable naming it", err)
		}
		delete(nodes, engine.NodeTag("node-b"))
		c.ResolveTTL = 1 // look it up again: it has left
		_, err = c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snaps["snap-of-b"]})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("deleting a snapshot whose node has left: %v, want Unavailable", err)
		}
	})
}

// TestControllerReconnects: a node that was down is asked again soon
// after it is back, however long it was down (gRPC's own backoff would
// wait up to two minutes, failing every call meanwhile).
func TestControllerReconnects(t *testing.T) {
	store := &transfer.MemoryStore{}
	b := startNode(t, store, "node-b")
	nodes := resolver{engine.NodeTag("node-b"): b}
	c := &Controller{Name: driverName, Version: "test", Creds: creds(t, store, transfer.ControllerPeer), Resolver: nodes, KeyOf: engine.KeyOf,
		Caps: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT}, ReconnectMax: 500 * time.Millisecond}
	defer c.Close()
	vb := volume(t, b, "pvc-b")
	if _, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "before", SourceVolumeId: vb}); err != nil {
		t.Fatal(err)
	}
	b.stop()
	<-b.done
	// Down long enough for gRPC's default backoff (1 s, times 1.6 each
	// try, 20% jitter) to wait 4.5 s or more after the node is back
	// before its next try; the calls meanwhile fail as the sidecars see.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if _, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "while-down", SourceVolumeId: vb}); status.Code(err) != codes.Unavailable {
			t.Fatalf("a snapshot while its node is down: %v, want Unavailable", err)
		}
	}
	serveAgain(t, store, b, b.d)
	back := time.Now()
	for {
		_, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "after", SourceVolumeId: vb})
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || time.Since(back) > 3*time.Second {
			t.Fatalf("%v after the node came back: %v, want it asked again within 3 s", time.Since(back), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("asked again %v after the node came back", time.Since(back))
}

// repeating is a node whose ListSnapshots answers an empty page and the
// same next token, whatever it is asked: a list that never advances.
type repeating struct {
	*hcsi.Driver
	calls atomic.Int64
}

func (r *repeating) ListSnapshots(context.Context, *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	r.calls.Add(1)
	return &csi.ListSnapshotsResponse{NextToken: "again"}, nil
}

// TestListSnapshotsStopsARepeatingNode: a node that repeats its page token
// gets one call refused naming it, after two pages, not an endless loop.
func TestListSnapshotsStopsARepeatingNode(t *testing.T) {
	store := &transfer.MemoryStore{}
	a := startNode(t, store, "node-a")
	rep := &repeating{Driver: a.d}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c2, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); ServeNode(c2, ln, creds(t, store, "node-r"), rep, a.d.UnaryInterceptor()) }()
	t.Cleanup(func() { cancel(); <-done })
	r := &testNode{name: "node-r", addr: ln.Addr().String()}
	c := &Controller{Name: driverName, Version: "test", Creds: creds(t, store, transfer.ControllerPeer),
		Resolver: resolver{engine.NodeTag("node-a"): a, engine.NodeTag("node-r"): r}, KeyOf: engine.KeyOf}
	defer c.Close()
	for _, tc := range []struct {
		name  string
		token string
	}{{"from the start", ""}, {"from its own token", engine.NodeTag("node-r") + "/again"}} {
		t.Run(tc.name, func(t *testing.T) {
			before := rep.calls.Load()
			_, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: tc.token})
			if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "node-r") || !strings.Contains(err.Error(), "does not advance") {
				t.Fatalf("ListSnapshots = %v, want Internal naming node-r and its token", err)
			}
			if n := rep.calls.Load() - before; n > 2 {
				t.Fatalf("the node was asked %d times, want at most 2", n)
			}
		})
	}
}

// TestControllerFindsAMovedVolume: a volume whose id names one node but
// which another holds now (moved to, or promoted on, its standby's node)
// is reached through Holders when its id's node says it lives elsewhere,
// or is down; without Holders the id's node's answer stands.
func TestControllerFindsAMovedVolume(t *testing.T) {
	store := &transfer.MemoryStore{}
	a, b := startNode(t, store, "node-a"), startNode(t, store, "node-b")
	nodes := resolver{engine.NodeTag("node-a"): a, engine.NodeTag("node-b"): b}
	moved := volume(t, b, "pvc-moved")
	// Its id names node-a, as a moved volume's does.
	keyOf := func(id string) (string, bool) {
		if id == moved {
			return engine.NodeTag("node-a"), true
		}
		return engine.KeyOf(id)
	}
	expand := func(c *Controller) error {
		_, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: moved, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}})
		return err
	}
	without := &Controller{Name: driverName, Creds: creds(t, store, transfer.ControllerPeer), Resolver: nodes, KeyOf: keyOf}
	defer without.Close()
	if err := expand(without); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("without Holders: %v, want node-a's ResourceExhausted", err)
	}
	var asked []string
	with := &Controller{Name: driverName, Creds: creds(t, store, transfer.ControllerPeer), Resolver: nodes, KeyOf: keyOf,
		Holders: func(_ context.Context, id string) []string {
			asked = append(asked, id)
			return []string{engine.NodeTag("node-a"), engine.NodeTag("node-b")}
		}}
	defer with.Close()
	if err := expand(with); err != nil || len(asked) != 1 {
		t.Fatalf("with Holders: %v (asked %v), want node-b's answer", err, asked)
	}
	a.stop()
	<-a.done
	if err := expand(with); err != nil {
		t.Fatalf("its id's node down: %v, want node-b's answer", err)
	}
	if _, err := with.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: volume(t, b, "pvc-b"), CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}}); err != nil {
		t.Fatalf("a volume on its own node: %v", err)
	}
}
