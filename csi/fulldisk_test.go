package csi

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestFullDisk: on a small file system that fills up, a clone, a snapshot
// and a restore fail with ResourceExhausted, leave no partial result and
// no record, and leave the source and the state as they were.
func TestFullDisk(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "ext4", 64<<20, []string{"-m", "0"}, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	cfg.Capacity = map[string]int64{"sim": 1 << 40} // let creates through; the disk is what runs out
	d := newDriver(t, cfg)
	src := mustCreate(t, d, "src", 1<<20)
	data := make([]byte, 24<<20) // incompressible
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(volumeDir(d, src.GetVolumeId()), "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	// A snapshot made while there is room, for the restore below: until
	// ready, so that its archive is whole before the disk fills.
	snap, err := testutil.SnapshotReady(ctx, d.CreateSnapshot, snapReq("early", src.GetVolumeId(), map[string]string{"format": "tar.gz"}))
	if err != nil {
		t.Fatal(err)
	}
	before := stateFiles(d)

	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}}})
	wantCode(t, err, codes.ResourceExhausted)
	// Asked until it is ready or fails, as the snapshotter does: on a
	// busy machine the archive runs past the request and its failure is
	// the answer to the next retry.
	_, err = testutil.SnapshotReady(ctx, d.CreateSnapshot, snapReq("late", src.GetVolumeId(), map[string]string{"format": "tar.gz"}))
	wantCode(t, err, codes.ResourceExhausted)
	_, err = d.CreateVolume(ctx, fromSnapshot("restore", snap.GetSnapshot().GetSnapshotId(), 32<<20))
	wantCode(t, err, codes.ResourceExhausted)

	if after := stateFiles(d); after != before {
		t.Fatalf("failed operations changed the state dir:\nbefore %s\nafter  %s", before, after)
	}
	if got, _ := os.ReadFile(filepath.Join(volumeDir(d, src.GetVolumeId()), "data")); len(got) != len(data) {
		t.Fatal("the source changed")
	}
	// With room again, the same requests succeed.
	os.Remove(filepath.Join(volumeDir(d, src.GetVolumeId()), "data"))
	if _, err := d.CreateVolume(ctx, fromSnapshot("restore", snap.GetSnapshot().GetSnapshotId(), 32<<20)); err != nil {
		t.Fatal(err)
	}
}

// stateFiles lists what is in the state dir (names only).
func stateFiles(d *Driver) string {
	var out []string
	filepath.Walk(stateRoot(d), func(p string, fi os.FileInfo, err error) error {
		if err == nil && p != stateRoot(d) {
			rel, _ := filepath.Rel(stateRoot(d), p)
			out = append(out, rel)
		}
		return nil
	})
	return filepath.Join(out...)
}
