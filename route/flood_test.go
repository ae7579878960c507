package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/transfer"
)

// TestControlPortUnderFlood: connections to a node's control port that
// never finish a TLS handshake (idle, or a ClientHello cut short), from
// one pod's address and from many, kept open and reopened as they are
// closed, do not keep the controller out: a controller that connects
// during the flood gets its snapshot made at once. Before, 32 idle
// connections held every slot for 10 s each (gRPC's handshake deadline),
// reopened at once. (A flood from the controller's own address, as from a
// pod masqueraded behind the same node address, still refuses most of its
// connections: docs/security.md, Known limits.)
func TestControlPortUnderFlood(t *testing.T) {
	store := &transfer.MemoryStore{}
	b := startNode(t, store, "node-b")
	nodes := resolver{engine.NodeTag("node-b"): b}
	vb := volume(t, b, "pvc-b")
	for i, tc := range []struct {
		name  string
		first byte // the first source address, 127.0.0.first
		peers int
		each  int
		hello bool
	}{
		{"one pod, idle", 2, 1, 300, false},
		{"one pod, a ClientHello cut short", 2, 1, 300, true},
		{"many pods", 2, 40, 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open, stop := testutil.FloodFrom(b.addr, tc.first, tc.peers, tc.each, tc.hello)
			defer stop()
			time.Sleep(500 * time.Millisecond) // the flood is on
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
