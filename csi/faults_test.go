package csi

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/internal/faultfs"
	"github.com/hostpath-csi/hostpath/loop"
)

// Real I/O errors (EIO from the kernel, through a FUSE file system that
// fails chosen reads and writes) under the state dir, in the middle of a
// clone, a snapshot, a restore, a block snapshot and a record write: each
// ends with an error that names the step and the cause, leaves nothing
// half-made listed or on disk, leaves the source intact, and the driver
// goes on serving other volumes; with the fault gone the same request
// succeeds.
func TestIOErrors(t *testing.T) {
	backing := t.TempDir()
	ffs := faultfs.Mount(t, backing, filepath.Join(t.TempDir(), "state"))
	cfg := testConfig(t)
	cfg.StateDir = ffs.Dir
	d := newDriver(t, cfg)
	// Closed before the FUSE mount goes: a descriptor left open on it
	// would be flushed at exit to a server that is gone, and hang.
	t.Cleanup(func() { d.Close() })

	src := mustCreate(t, d, "pvc-src", 64<<20).GetVolumeId()
	// Written beside the mount, so no page cache of the FUSE file system
	// answers the reads the faults are meant to break.
	big := make([]byte, 8<<20)
	rand.Read(big)
	srcDir := filepath.Join(backing, "volumes", src)
	if err := os.WriteFile(filepath.Join(srcDir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		os.WriteFile(filepath.Join(srcDir, "small-"+string(rune('a'+i))), bytes.Repeat([]byte{byte(i)}, 3000), 0o644)
	}
	srcSum := treeSum(t, srcDir)
	other := mustCreate(t, d, "pvc-other", 1<<20).GetVolumeId()

	inSource := func(p string) bool { return strings.HasPrefix(p, "/volumes/"+src+"/") }
	fails := func(name string, fault faultfs.Fault, call func() error) {
		t.Helper()
		hits := ffs.Hits()
		failsCleanly(t, d, name, other, func() { ffs.Inject(fault) }, ffs.Clear, call)
		if ffs.Hits() == hits {
			t.Fatalf("%s: no injected fault was hit", name)
		}
	}

	clone := createReq("pvc-clone", 64<<20)
	clone.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}}
	srcFault := faultfs.Fault{Op: faultfs.Read, Match: inSource, After: 1 << 20}
	fails("tar.gz snapshot of a source that fails reads", srcFault, func() error {
		_, err := d.CreateSnapshot(ctx, snapReq("snap-eio", src, map[string]string{"format": "tar.gz"}))
		return err
	})
	fails("clone of a source that fails reads", srcFault, func() error { _, err := d.CreateVolume(ctx, clone); return err })
	if got := treeSum(t, srcDir); got != srcSum {
		t.Fatal("the source changed")
	}
	// With the fault gone, the same requests succeed.
	snap, err := d.CreateSnapshot(ctx, snapReq("snap-eio", src, map[string]string{"format": "tar.gz"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreateVolume(ctx, clone); err != nil {
		t.Fatal(err)
	}

	sid := snap.GetSnapshot().GetSnapshotId()
	snapFault := faultfs.Fault{Op: faultfs.Read, Match: func(p string) bool { return strings.HasPrefix(p, "/snapshots/"+sid) }, After: 64 << 10}
	fails("restore from a snapshot that fails reads", snapFault, func() error {
		_, err := d.CreateVolume(ctx, fromSnapshot("pvc-restore", sid, 64<<20))
		return err
	})
	if _, err := d.CreateVolume(ctx, fromSnapshot("pvc-restore", sid, 64<<20)); err != nil {
		t.Fatal(err)
	}

	blk := createBlock(t, d, "blk-eio", 16<<20).GetVolumeId()
	dev, ok, _ := loop.Find(filepath.Join(ffs.Dir, "volumes", blk+".img"))
	if !ok {
		t.Fatal("block volume has no device")
	}
	if f, err := os.OpenFile(dev.Path(), os.O_WRONLY, 0); err == nil {
		f.WriteAt(bytes.Repeat([]byte{9}, 1<<20), 4<<20)
		f.Sync()
		f.Close()
	}
	blkFault := faultfs.Fault{Op: faultfs.Read, Match: func(p string) bool { return p == "/volumes/"+blk+".img" }, After: 2 << 20}
	fails("block snapshot of a backing file that fails reads", blkFault, func() error {
		_, err := d.CreateSnapshot(ctx, snapReq("blk-snap-eio", blk, nil))
		return err
	})
	if _, err := d.CreateSnapshot(ctx, snapReq("blk-snap-eio", blk, nil)); err != nil {
		t.Fatal(err)
	}

	recordFault := faultfs.Fault{Op: faultfs.Write, Match: func(p string) bool { return strings.HasPrefix(p, "/meta/volumes/") }}
	fails("CreateVolume whose record write fails", recordFault, func() error {
		_, err := d.CreateVolume(ctx, createReq("pvc-record-eio", 1<<20))
		return err
	})
	if _, err := d.CreateVolume(ctx, createReq("pvc-record-eio", 1<<20)); err != nil {
		t.Fatalf("the same create once writes work: %v", err)
	}
	if got := treeSum(t, srcDir); got != srcSum {
		t.Fatal("the source changed")
	}
}

// failsCleanly runs call with a fault in place (set, then clear once call
// returns) and checks that it failed with Internal naming the I/O error,
// left the state dir as it was, and that the driver still publishes the
// volume other.
func failsCleanly(t *testing.T, d *Driver, name, other string, set, clear func(), call func() error) {
	t.Helper()
	before := stateFiles(d)
	set()
	err := call()
	clear()
	if err == nil {
		t.Fatalf("%s succeeded through an I/O error", name)
	}
	if c := status.Code(err); c != codes.Internal || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("%s: %v, want Internal naming the I/O error", name, err)
	}
	if after := stateFiles(d); after != before {
		t.Fatalf("%s left something behind:\nbefore %s\nafter  %s", name, before, after)
	}
	// The driver goes on serving other volumes.
	target := filepath.Join(t.TempDir(), "target")
	unmountAll(t, target)
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: other, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatalf("after %s, publishing another volume: %v", name, err)
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: other, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %v", name, err)
}

// treeSum hashes the names (relative to dir) and contents of the regular
// files in dir: two trees with the same files give the same sum.
func treeSum(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		h.Write([]byte(rel + "\x00"))
		h.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(h.Sum(nil))
}
