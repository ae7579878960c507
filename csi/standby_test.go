package csi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestStandbyParameter: a class asking for a standby copy gets one on
// another node running the driver, the same for a retry of the name, named
// in the volume's context (which the PV carries to that node); each case
// where none can be kept is refused with a message that says why.
func TestStandbyParameter(t *testing.T) {
	testutil.RequireRoot(t)
	xfs := filepath.Join(testfs.FileSystem(t, run, "xfs", 300<<20, nil, ""), "pool")
	if err := os.Mkdir(xfs, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Pools = map[string]string{"shared": xfs}
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	nodes := []string{}
	d.eng.SetStandbyNodes(func(context.Context) ([]string, error) { return nodes, nil })
	req := func(name string, block bool, params map[string]string) *csi.CreateVolumeRequest {
		r := createReq(name, 16<<20)
		if block {
			r.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
		}
		r.Parameters = params
		return r
	}
	for _, tc := range []struct {
		name   string
		block  bool
		params map[string]string
		nodes  []string
		code   codes.Code
	}{
		{"a standby of 2", true, map[string]string{"standby": "2", "pool": "shared"}, nil, codes.InvalidArgument},
		{"an interval under a second", true, map[string]string{"standby": "1", "standbyInterval": "500ms", "pool": "shared"}, nil, codes.InvalidArgument},
		{"a directory volume", false, map[string]string{"standby": "1", "pool": "shared"}, []string{"node-1", "node-2"}, codes.InvalidArgument},
		{"a pool that cannot share blocks", true, map[string]string{"standby": "1"}, []string{"node-1", "node-2"}, codes.InvalidArgument},
		{"no other node", true, map[string]string{"standby": "1", "pool": "shared"}, []string{"node-1"}, codes.ResourceExhausted},
		{"a block volume on a shared pool", true, map[string]string{"standby": "1", "standbyInterval": "5s", "pool": "shared"}, []string{"node-1", "node-2", "node-3"}, codes.OK},
		{"an image volume on a shared pool", false, map[string]string{"standby": "1", "pool": "shared", "layout": "image"}, []string{"node-1", "node-2", "node-3"}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes = tc.nodes
			resp, err := d.CreateVolume(ctx, req("pvc-"+tc.name, tc.block, tc.params))
			if status.Code(err) != tc.code {
				t.Fatalf("%v, want %v", err, tc.code)
			}
			if err != nil {
				t.Logf("refused: %v", err)
				return
			}
			vc := resp.GetVolume().GetVolumeContext()
			standby := vc[engine.CtxStandby]
			if (standby != "node-2" && standby != "node-3") || vc[engine.CtxPrimary] != "node-1" || vc[engine.CtxStandbyPool] != "shared" {
				t.Fatalf("volume context %v: want a standby on node-2 or node-3, primary node-1", vc)
			}
			var admits []string
			for _, top := range resp.GetVolume().GetAccessibleTopology() {
				admits = append(admits, top.GetSegments()[TopologyKey])
			}
			if len(admits) != 2 || admits[0] != "node-1" || admits[1] != standby {
				t.Errorf("accessible topology %v: want node-1, then the standby's node %s", admits, standby)
			}
			v, _ := d.eng.Records.Volumes.Get(resp.GetVolume().GetVolumeId())
			if v.Standby != standby {
				t.Errorf("the record names standby %q, the context %q", v.Standby, standby)
			}
			again, err := d.CreateVolume(ctx, req("pvc-"+tc.name, tc.block, tc.params))
			if err != nil || again.GetVolume().GetVolumeContext()[engine.CtxStandby] != standby {
				t.Errorf("a retry: %v, %v; want the same standby %s", again.GetVolume().GetVolumeContext(), err, standby)
			}
			if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.ID}); err != nil {
				t.Fatal(err)
			}
		})
	}
	// Without the cluster's list of nodes (by hand, csi-sanity), none.
	bare := newDriver(t, testConfig(t))
	t.Cleanup(func() { bare.Close() })
	if _, err := bare.CreateVolume(ctx, req("pvc-bare", true, map[string]string{"standby": "1"})); status.Code(err) != codes.InvalidArgument {
		t.Errorf("outside a cluster: %v, want InvalidArgument", err)
	}
}

// TestStandbyStageNotFenced: NodeStage of a volume on the node that keeps
// its standby copy, while the primary is not fenced, is FailedPrecondition
// naming the primary and the fence that would let it go on (kubelet shows
// it in the pod's events and tries again), not the ResourceExhausted of a
// volume of another node.
func TestStandbyStageNotFenced(t *testing.T) {
	cfg := testConfig(t)
	cfg.NodeID = "node-2"
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	id := engine.NewID(engine.VolumeIDPrefix, engine.NodeTag("node-1"))
	if _, err := d.eng.AddStandby(engine.StandbySpec{Volume: id, Primary: "node-1", Access: engine.AccessBlock}); err != nil {
		t.Fatal(err)
	}
	d.eng.SetFences(func(context.Context, string) (string, error) { return "", nil })
	_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(t.TempDir(), "staging"), VolumeCapability: blockCap()})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "node-1") || !strings.Contains(err.Error(), "out-of-service") {
		t.Fatalf("stage of a standby copy, primary not fenced: %v, want FailedPrecondition naming node-1 and the out-of-service taint", err)
	}
	other := engine.NewID(engine.VolumeIDPrefix, engine.NodeTag("node-3"))
	_, err = d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: other, StagingTargetPath: filepath.Join(t.TempDir(), "staging"), VolumeCapability: blockCap()})
	wantCode(t, err, codes.ResourceExhausted)
}
