package csi

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/transfer"
)

// growOnPull runs grow once, right before the first stream (not a stat)
// is asked for: between the two requests of a pull from another node.
type growOnPull struct {
	engine.Peers
	grow func()
}

func (g *growOnPull) Open(ctx context.Context, tag, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, string, error) {
	if !statOnly && g.grow != nil {
		g.grow()
		g.grow = nil
	}
	return g.Peers.Open(ctx, tag, kind, id, statOnly)
}

// TestBlockCloneFromGrownSource: a block volume of node a grown between
// node b's stat of it and its pull is refused (Aborted, saying it grew)
// before a byte is written: nothing is left on b, and the pool is never
// filled past the capacity reserved (the first version wrote the grown
// image in full, cut it and said Ready). Asked again, the clone gets the
// new size.
func TestBlockCloneFromGrownSource(t *testing.T) {
	a, b, bp := newPeerPair(t, "")
	src := createBlock(t, a.d, "blk", 16<<20)
	path := a.d.eng.VolumeDataPath(engine.VolumeRecord{ID: src.GetVolumeId(), AccessType: engine.AccessBlock})
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte(strings.Repeat("x", 4096)), 15<<20)
	f.Close()
	b.d.eng.SetPeers(&growOnPull{Peers: bp, grow: func() {
		if _, err := a.d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: src.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}}); err != nil {
			t.Errorf("growing the source: %v", err)
		}
		f, _ := os.OpenFile(path, os.O_WRONLY, 0)
		f.WriteAt([]byte(strings.Repeat("y", 4096)), 30<<20)
		f.Close()
	}})
	_, err = b.d.CreateVolume(ctx, asBlock(fromVolume("clone", src.GetVolumeId(), 16<<20)))
	wantCode(t, err, codes.Aborted)
	if !strings.Contains(err.Error(), "grew") {
		t.Fatalf("clone of a source grown meanwhile: %v, want it said", err)
	}
	nothingBuilt(t, b.d)
	v, err := b.d.CreateVolume(ctx, asBlock(fromVolume("clone", src.GetVolumeId(), 32<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolume().GetVolumeId()}) })
	if v.GetVolume().GetCapacityBytes() != 32<<20 {
		t.Fatalf("the clone has %d bytes, want the grown source's", v.GetVolume().GetCapacityBytes())
	}
	got := make([]byte, 4096)
	g, _ := os.Open(b.d.eng.VolumeDataPath(engine.VolumeRecord{ID: v.GetVolume().GetVolumeId(), AccessType: engine.AccessBlock}))
	defer g.Close()
	g.ReadAt(got, 30<<20)
	if string(got) != strings.Repeat("y", 4096) {
		t.Fatal("the clone lacks the grown source's data")
	}
}
