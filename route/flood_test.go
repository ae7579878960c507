package route

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/transfer"
)

// TestControlPortUnderFlood: connections to a node's control port that
// never finish a TLS handshake (idle, or a ClientHello cut short), from
// the controller's own address (a pod masqueraded behind the same node
// address: the controller's knock gets it past them), from one pod's
// address and from many, kept open and reopened as they are closed, do
// not keep the controller out: a controller that connects during the
// flood gets its snapshot made at once. Before, 32 idle connections held
// every slot for 10 s each (gRPC's handshake deadline), reopened at once.
func TestControlPortUnderFlood(t *testing.T) {
	store := &transfer.MemoryStore{}
	b := startNode(t, store, "node-b")
	nodes := resolver{engine.NodeTag("node-b"): b}
	vb := volume(t, b, "pvc-b")
	for i, tc := range []struct {
		name  string
		first byte // the first source address, 127.0.0.first (1: the controller's)
		peers int
		each  int
		hello bool
	}{
		{"the controller's own address, idle", 1, 1, 300, false},
		{"the controller's own address, a ClientHello cut short", 1, 1, 300, true},
		{"one pod, idle", 2, 1, 300, false},
		{"one pod, a ClientHello cut short", 2, 1, 300, true},
		{"many pods", 2, 40, 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open, stop := testutil.FloodFrom(b.addr, tc.first, tc.peers, tc.each, tc.hello)
			defer stop()
			time.Sleep(500 * time.Millisecond)           // the flood is on
			if n := open(); n < int64(min(8, tc.each)) { // at least an address's share of the pending slots
				t.Fatalf("only %d attacking connections open", n)
			}
			// A controller that connects now, as one started during the
			// flood or reconnecting does.
			c := &Controller{Name: driverName, Version: "test", Creds: creds(t, store, transfer.ControllerPeer), Resolver: nodes, KeyOf: engine.KeyOf,
				Caps: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT}}
			defer c.Close()
			start := time.Now()
			_, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: fmt.Sprintf("flooded-%d", i), SourceVolumeId: vb})
			took := time.Since(start)
			if err != nil {
				t.Fatalf("a snapshot under %d unauthenticated connections, after %v: %v", open(), took, err)
			}
			// The attackers' handshakes last 3 s, and gRPC's used to
			// last 10: a call that waited for them takes that long.
			if took > 2500*time.Millisecond {
				t.Fatalf("a snapshot under %d unauthenticated connections took %v: it waited for attackers' handshakes", open(), took)
			}
			t.Logf("snapshot made in %v under %d unauthenticated connections", took.Round(time.Millisecond), open())
		})
	}
}

// slowSnapshots is a node whose CreateSnapshot waits until gate closes
// (a big archive, say).
type slowSnapshots struct {
	Target
	gate chan struct{}
	in   atomic.Int32
}

func (s *slowSnapshots) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	s.in.Add(1)
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Target.CreateSnapshot(ctx, req)
}

// TestSnapshotsBoundedPerNode: snapshots that take long on one node hold
// at most MaxSnapshotsPerNode of the controller's calls (the
// csi-snapshotter's workers) on it; one more is Aborted at once, naming
// the bound, and another node's snapshot is made meanwhile. Before, one
// node's big snapshots held every worker of the one snapshotter.
func TestSnapshotsBoundedPerNode(t *testing.T) {
	store := &transfer.MemoryStore{}
	a := startNode(t, store, "node-a")
	b := startNode(t, store, "node-b")
	b.stop()
	<-b.done
	// node-b again, its snapshots slow.
	slow := &slowSnapshots{Target: b.d, gate: make(chan struct{})}
	serveAgain(t, store, b, slow)
	nodes := resolver{engine.NodeTag("node-a"): a, engine.NodeTag("node-b"): b}
	c := &Controller{Name: driverName, Version: "test", Creds: creds(t, store, transfer.ControllerPeer), Resolver: nodes, KeyOf: engine.KeyOf,
		Caps: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT}, MaxSnapshotsPerNode: 2}
	defer c.Close()
	va, vb := volume(t, a, "pvc-a"), volume(t, b, "pvc-b")
	errs := make(chan error, 2)
	for i := range 2 {
		v := volume(t, b, fmt.Sprintf("pvc-slow-%d", i))
		go func() {
			_, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: fmt.Sprintf("slow-%d", i), SourceVolumeId: v})
			errs <- err
		}()
	}
	for deadline := time.Now().Add(30 * time.Second); slow.in.Load() < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 2 snapshots reached node-b in 30 s", slow.in.Load())
		}
	}
	start := time.Now()
	_, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "one-more", SourceVolumeId: vb})
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "2 snapshots being asked for") || time.Since(start) > 5*time.Second {
		t.Fatalf("a third snapshot on node-b: %v after %v, want Aborted at once naming the bound", err, time.Since(start))
	}
	if slow.in.Load() != 2 {
		t.Fatalf("node-b was asked for %d snapshots, want 2", slow.in.Load())
	}
	if _, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "elsewhere", SourceVolumeId: va}); err != nil {
		t.Fatalf("a snapshot on node-a while node-b's are slow: %v", err)
	}
	close(slow.gate)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("a slow snapshot: %v", err)
		}
	}
	if _, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "one-more", SourceVolumeId: vb}); err != nil {
		t.Fatalf("the third snapshot once the others ended: %v", err)
	}
}
