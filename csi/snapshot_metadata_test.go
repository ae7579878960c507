package csi

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/loop"
)

// fakeStream collects what a server stream sends.
type fakeStream[T any] struct {
	grpc.ServerStream
	got []*T
}

func (f *fakeStream[T]) Send(m *T) error          { f.got = append(f.got, m); return nil }
func (f *fakeStream[T]) Context() context.Context { return context.Background() }

func writeDev(t *testing.T, d *Driver, vol string, off int64, data []byte) {
	dev, _, _ := loop.Find(filepath.Join(volumesDir(d), vol+".img"))
	f, err := os.OpenFile(dev.Path(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(data, off)
	f.Sync()
	f.Close()
}

func TestSnapshotMetadata(t *testing.T) {
	d := newDriver(t, testConfig(t))
	// A sparse block volume: restore from a snapshot of an empty file
	// keeps holes, so make the source by restoring.
	v := createBlock(t, d, "meta", 16<<20)
	vid := v.GetVolumeId()
	// Punch the preallocation away so only written data is allocated.
	p := filepath.Join(volumesDir(d), vid+".img")
	f, _ := os.OpenFile(p, os.O_RDWR, 0)
	f.Truncate(0)
	f.Truncate(16 << 20)
	f.Close()
	block := make([]byte, 64<<10)
	for i := range block {
		block[i] = 1
	}
	writeDev(t, d, vid, 1<<20, block)
	s1, err := d.CreateSnapshot(ctx, snapReq("m1", vid, nil))
	if err != nil {
		t.Fatal(err)
	}
	writeDev(t, d, vid, 8<<20, block)        // new data
	writeDev(t, d, vid, 1<<20, block[:4096]) // same bytes: not a change
	block2 := append([]byte(nil), block[:4096]...)
	block2[0] = 9
	writeDev(t, d, vid, 1<<20+8192, block2) // one changed 4 KiB block
	s2, err := d.CreateSnapshot(ctx, snapReq("m2", vid, nil))
	if err != nil {
		t.Fatal(err)
	}
	alloc := &fakeStream[csi.GetMetadataAllocatedResponse]{}
	if err := d.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: s1.GetSnapshot().GetSnapshotId()}, alloc); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, r := range alloc.got {
		for _, b := range r.GetBlockMetadata() {
			total += b.GetSizeBytes()
			if b.GetByteOffset() > 1<<20 || b.GetByteOffset()+b.GetSizeBytes() < 1<<20+64<<10 {
				t.Errorf("allocated range %d+%d does not cover what was written", b.GetByteOffset(), b.GetSizeBytes())
			}
		}
	}
	if total == 0 || total > 1<<20 {
		t.Fatalf("allocated %d bytes; want about 64 KiB of a 16 MiB volume", total)
	}
	delta := &fakeStream[csi.GetMetadataDeltaResponse]{}
	if err := d.GetMetadataDelta(&csi.GetMetadataDeltaRequest{BaseSnapshotId: s1.GetSnapshot().GetSnapshotId(), TargetSnapshotId: s2.GetSnapshot().GetSnapshotId(), MaxResults: 1}, delta); err != nil {
		t.Fatal(err)
	}
	var ranges [][2]int64
	for _, r := range delta.got {
		if len(r.GetBlockMetadata()) != 1 {
			t.Fatalf("max_results 1, got %d", len(r.GetBlockMetadata()))
		}
		b := r.GetBlockMetadata()[0]
		ranges = append(ranges, [2]int64{b.GetByteOffset(), b.GetSizeBytes()})
	}
	want := [][2]int64{{1<<20 + 8192, 4096}, {8 << 20, 64 << 10}}
	if len(ranges) != 2 || ranges[0] != want[0] || ranges[1] != want[1] {
		t.Fatalf("delta %v, want %v", ranges, want)
	}
	err = d.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: s1.GetSnapshot().GetSnapshotId(), StartingOffset: 1 << 40}, alloc)
	wantCode(t, err, codes.OutOfRange)
	dirVol := mustCreate(t, d, "dir", 1<<20)
	ds, _ := d.CreateSnapshot(ctx, snapReq("dirsnap", dirVol.GetVolumeId(), nil))
	err = d.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: ds.GetSnapshot().GetSnapshotId()}, alloc)
	wantCode(t, err, codes.InvalidArgument)
}
