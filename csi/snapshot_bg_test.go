package csi

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/internal/testfs"
)

// TestSnapshotAnsweredOnceCut: a snapshot longer than its cut (here the
// archive of 128 MiB that does not compress) is answered as soon as it is
// cut, ready_to_use false, and made in the background: a retry returns the
// same snapshot at once, ListSnapshots and GetSnapshot report it not
// ready, a restore from it waits for it, and once ready a retry returns it
// ready, made once. A DeleteSnapshot of one being made stops it and leaves
// nothing, and so does the driver's stop.
func TestSnapshotAnsweredOnceCut(t *testing.T) {
	cfg := testConfig(t)
	cfg.SnapshotReadyGrace = time.Second
	d := newDriver(t, cfg)
	v := mustCreate(t, d, "big", 1<<30)
	// 128 files of 1 MiB, incompressible: gzip takes a while, and an
	// archive stops between files when it is cancelled.
	data := make([]byte, 1<<20)
	for i := range 128 {
		rand.Read(data)
		if err := os.WriteFile(filepath.Join(volumeDir(d, v.GetVolumeId()), fmt.Sprintf("data-%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	params := map[string]string{"format": "tar.gz"}
	notReady := func(name string) *csi.Snapshot {
		t.Helper()
		start := time.Now()
		r, err := d.CreateSnapshot(ctx, snapReq(name, v.GetVolumeId(), params))
		if err != nil || r.GetSnapshot().GetReadyToUse() || time.Since(start) > 10*time.Second {
			t.Fatalf("snapshot %s: %v, ready %v after %v; want it answered not ready once cut", name, err, r.GetSnapshot().GetReadyToUse(), time.Since(start))
		}
		return r.GetSnapshot()
	}
	s := notReady("s")
	if s.GetSnapshotId() == "" || s.GetCreationTime().AsTime().IsZero() || s.GetSourceVolumeId() != v.GetVolumeId() {
		t.Fatalf("the snapshot answered not ready: %+v, want its id, instant and source", s)
	}
	if again := notReady("s"); again.GetSnapshotId() != s.GetSnapshotId() || !again.GetCreationTime().AsTime().Equal(s.GetCreationTime().AsTime()) {
		t.Fatalf("a retry while it is made: %+v, want %+v again", again, s)
	}
	l, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: s.GetSnapshotId()})
	if err != nil || len(l.GetEntries()) != 1 || l.GetEntries()[0].GetSnapshot().GetReadyToUse() {
		t.Fatalf("ListSnapshots of one being made: %v %v, want it, not ready", l.GetEntries(), err)
	}
	g, err := d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: s.GetSnapshotId()})
	if err != nil || g.GetSnapshot().GetReadyToUse() {
		t.Fatalf("GetSnapshot of one being made: %v %v, want it, not ready", g, err)
	}
	// A restore from it waits until it is made.
	src := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.GetSnapshotId()}}}
	rreq := createReq("restored", 1<<30)
	rreq.VolumeContentSource = src
	if _, err := d.CreateVolume(ctx, rreq); err != nil {
		t.Fatalf("a restore from a snapshot being made: %v, want it made once the snapshot is", err)
	}
	rv, _ := volumeNamed(d, "restored")
	if n, err := os.ReadDir(volumeDir(d, rv.ID)); err != nil || len(n) != 128 {
		t.Fatalf("the restore holds %d files (%v), want 128", len(n), err)
	}
	r, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), params))
	if err != nil || !r.GetSnapshot().GetReadyToUse() || r.GetSnapshot().GetSnapshotId() != s.GetSnapshotId() ||
		!r.GetSnapshot().GetCreationTime().AsTime().Equal(s.GetCreationTime().AsTime()) {
		t.Fatalf("the snapshot once made: %+v %v, want %s ready, of the same instant", r.GetSnapshot(), err, s.GetSnapshotId())
	}

	// A delete of one being made stops it: nothing is left.
	del := notReady("del")
	if _, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: del.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if rec, ok := snapshotNamed(d, "del"); ok {
		t.Fatalf("a snapshot deleted while being made left its record: %+v", rec)
	}
	if l, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: del.GetSnapshotId()}); err != nil || len(l.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots of a deleted one: %v %v, want none", l.GetEntries(), err)
	}

	// The driver's stop cuts one being made: nothing is left. Its
	// request may end before the cut (Aborted) or after (not ready).
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if r, err := d.CreateSnapshot(short, snapReq("cut", v.GetVolumeId(), params)); status.Code(err) != codes.Aborted && (err != nil || r.GetSnapshot().GetReadyToUse()) {
		t.Fatalf("a snapshot longer than its request: %v, want Aborted or not ready", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if s, ok := snapshotNamed(d, "cut"); ok {
		t.Fatalf("the cut snapshot left its record: %+v", s)
	}
	if n := len(allSnapshots(d)); n != 1 {
		t.Fatalf("%d snapshots after the stop, want the one made", n)
	}
	if left, _ := os.ReadDir(snapshotsDir(d)); len(left) != 1 {
		t.Fatalf("snapshot data after the stop: %v, want the one made", left)
	}
}

// TestSnapshotFailedPastItsRequest: a snapshot answered not ready that
// then fails (its archive fills the file system) is answered its error at
// the next retry, as the snapshotter shows a failure made under its
// request, and nothing of it is left; the retry after starts it again.
func TestSnapshotFailedPastItsRequest(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "ext4", 384<<20, []string{"-m", "0"}, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	cfg.Capacity = map[string]int64{"sim": 1 << 40} // the disk is what runs out
	cfg.SnapshotReadyGrace = time.Second
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	v := mustCreate(t, d, "big", 1<<30)
	data := make([]byte, 1<<20)
	for i := range 192 {
		rand.Read(data)
		if err := os.WriteFile(filepath.Join(volumeDir(d, v.GetVolumeId()), fmt.Sprintf("data-%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	req := snapReq("s", v.GetVolumeId(), map[string]string{"format": "tar.gz"})
	r, err := d.CreateSnapshot(ctx, req)
	if err != nil || r.GetSnapshot().GetReadyToUse() {
		t.Fatalf("the first request: %v, ready %v; want it answered not ready once cut", err, r.GetSnapshot().GetReadyToUse())
	}
	deadline := time.Now().Add(2 * time.Minute)
	for err == nil {
		if time.Now().After(deadline) {
			t.Fatal("the snapshot neither failed nor was made within 2 minutes")
		}
		time.Sleep(50 * time.Millisecond)
		r, err = d.CreateSnapshot(ctx, req)
		if err == nil && (r.GetSnapshot().GetReadyToUse() || r.GetSnapshot().GetSnapshotId() == "") {
			t.Fatalf("a retry while it is made: %+v, want it not ready", r.GetSnapshot())
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "failed after its request was answered") {
		t.Fatalf("the retry after the failure: %v, want ResourceExhausted saying it failed past its request", err)
	}
	if s, ok := snapshotNamed(d, "s"); ok {
		t.Fatalf("the failed snapshot left its record: %+v", s)
	}
	if left, _ := os.ReadDir(snapshotsDir(d)); len(left) != 0 {
		t.Fatalf("the failed snapshot left data: %v", left)
	}
	// Heard once: the next retry starts it again.
	if r, err := d.CreateSnapshot(ctx, req); err != nil || r.GetSnapshot().GetReadyToUse() {
		t.Fatalf("the retry after the error: %v, ready %v; want it started again, not ready", err, r.GetSnapshot().GetReadyToUse())
	}
}
