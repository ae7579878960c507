package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/transfer"
)

// BenchmarkRestoreFromPeer: CreateVolume from a directory snapshot (tar.gz
// and tar.zst) on the node that holds it ("local"), against the same
// restore on another node that pulls the snapshot from the first through
// the node-to-node transfer (mutual TLS over loopback TCP: "from-peer"),
// and `tar xzf` of the same archive. Both drivers' state dirs are on the
// same fresh file-system image, so the local restore and the pull read and
// write the same disk. Goal: from-peer at least 0.8x local.
func BenchmarkRestoreFromPeer(b *testing.B) {
	testutil.RequireRoot(b)
	mount := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	ctx := context.Background()
	for _, fs := range fileSystems(b) {
		if fs.name == "btrfs" {
			continue // ext4 and XFS are what users put volumes on
		}
		for _, ds := range dataSets {
			src, size := source(b, fs, ds)
			drivers, states := peerDrivers(b, fs, "node-a", "node-b")
			a, bnode := drivers["node-a"], drivers["node-b"]
			vol, err := a.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "src", VolumeCapabilities: []*csipb.VolumeCapability{mount},
				CapacityRange: &csipb.CapacityRange{RequiredBytes: size + 64<<20}})
			if err != nil {
				b.Fatal(err)
			}
			volDir := filepath.Join(states["node-a"], "volumes", vol.GetVolume().GetVolumeId())
			if _, err := fsops.CopyTree(ctx, src, volDir); err != nil {
				b.Fatal(err)
			}
			for _, format := range []struct{ name, archive string }{{"tar.gz", ".tar.gz"}, {"tar.zst", ".tar.zst"}} {
				params := map[string]string{"format": "tar.gz"}
				if format.name == "tar.zst" {
					params = map[string]string{"compression": "zstd"}
				}
				snap, err := testutil.SnapshotReady(ctx, a.CreateSnapshot, &csipb.CreateSnapshotRequest{Name: "snap-" + format.name, SourceVolumeId: vol.GetVolume().GetVolumeId(), Parameters: params})
				if err != nil {
					b.Fatal(err)
				}
				snapID := snap.GetSnapshot().GetSnapshotId()
				restoreOn := func(d *hcsi.Driver) func(b *testing.B, _ string) {
					return func(b *testing.B, _ string) {
						outSeq++
						v, err := d.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: fmt.Sprintf("r%d", outSeq), VolumeCapabilities: []*csipb.VolumeCapability{mount},
							CapacityRange:       &csipb.CapacityRange{RequiredBytes: size + 64<<20},
							VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}})
						b.StopTimer()
						if err != nil {
							b.Fatal(err)
						}
						if _, err := d.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
					}
				}
				vs := []variant{{"local", restoreOn(a)}, {"from-peer", restoreOn(bnode)}}
				if format.name == "tar.gz" {
					archivePath := filepath.Join(states["node-a"], "snapshots", snapID+format.archive)
					if _, err := os.Stat(archivePath); err != nil {
						b.Fatalf("the snapshot is not where the layout puts it: %v", err)
					}
					vs = append(vs, variant{"tar-xzf", func(b *testing.B, dst string) { run(b, "tar", "xzf", archivePath, "-C", dst) }})
				}
				compare(b, fs.name+"/"+ds.name+"/"+format.name, size, fs, vs)
			}
		}
	}
}

// peerDrivers starts a driver per node, each with its state dir on fs,
// reaching the others through the node-to-node transfer (mutual TLS over
// loopback TCP), and returns them and their state dirs by node.
func peerDrivers(b *testing.B, fs *benchFS, nodes ...string) (map[string]*hcsi.Driver, map[string]string) {
	ctx := context.Background()
	store := &transfer.MemoryStore{}
	drivers := map[string]*hcsi.Driver{}
	addrs, states := map[string]string{}, map[string]string{}
	var mu sync.Mutex
	for _, node := range nodes {
		state := outDir(b, fs, "peer-"+node)
		states[node] = state
		d, err := hcsi.New(engine.Config{DriverName: "bench", Version: "b", NodeID: node, StateDir: state, MaxVolumeSize: 1 << 40, MaxHeavyOps: 4})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		creds := &transfer.Credentials{Store: store, Driver: "bench", Node: node}
		if err := creds.Refresh(ctx); err != nil {
			b.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			(&transfer.Server{Creds: creds, Source: d.Engine().TransferSource(), Authorizer: transfer.AllowAll}).Serve(sctx, ln)
		}()
		b.Cleanup(func() { cancel(); <-done })
		mu.Lock()
		addrs[node] = ln.Addr().String()
		mu.Unlock()
		d.Engine().SetPeers(&transfer.Peers{Client: &transfer.Client{Creds: creds}, Resolve: func(_ context.Context, tag string) (string, string, error) {
			mu.Lock()
			defer mu.Unlock()
			for n, a := range addrs {
				if engine.NodeTag(n) == tag {
					return a, n, nil
				}
			}
			return "", "", fmt.Errorf("no node with tag %s", tag)
		}})
		drivers[node] = d
	}
	return drivers, states
}
