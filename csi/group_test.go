package csi

import (
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

func TestGroupSnapshot(t *testing.T) {
	d := newDriver(t, testConfig(t))
	a := mustCreate(t, d, "a", 1<<20).GetVolumeId()
	b := mustCreate(t, d, "b", 1<<20).GetVolumeId()
	os.WriteFile(volumeDir(d, a)+"/f", []byte("a"), 0o644)
	r, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	g := r.GetGroupSnapshot()
	if len(g.GetSnapshots()) != 2 || !g.GetReadyToUse() || g.GetSnapshots()[0].GetGroupSnapshotId() != g.GetGroupSnapshotId() {
		t.Fatalf("group %v", g)
	}
	again, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{b, a}})
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != g.GetGroupSnapshotId() {
		t.Fatalf("retry: %v %v", again, err)
	}
	_, err = d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{a}})
	wantCode(t, err, codes.AlreadyExists)
	// Members restore like any snapshot, and cannot be deleted alone.
	member := g.GetSnapshots()[0].GetSnapshotId()
	if _, err := d.CreateVolume(ctx, fromSnapshot("from-member", member, 1<<20)); err != nil {
		t.Fatal(err)
	}
	_, err = d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: member})
	wantCode(t, err, codes.FailedPrecondition)
	if got, err := d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()}); err != nil || len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Fatalf("get: %v %v", got, err)
	}
	if _, err := d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	if len(allSnapshots(d)) != 0 {
		t.Fatal("deleting the group left member snapshots")
	}
	_, err = d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()})
	wantCode(t, err, codes.NotFound)
}

// TestGroupSnapshotAllOrNothing: a member that cannot be snapshotted
// leaves no member snapshot and no group behind.
func TestGroupSnapshotAllOrNothing(t *testing.T) {
	d := newDriver(t, testConfig(t))
	a := mustCreate(t, d, "a", 1<<20).GetVolumeId()
	b := mustCreate(t, d, "b", 1<<20).GetVolumeId()
	os.RemoveAll(volumeDir(d, b)) // its data is gone: its snapshot fails
	_, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: []string{a, b}})
	if err == nil {
		t.Fatal("group of a broken volume succeeded")
	}
	if len(allSnapshots(d)) != 0 || len(allGroups(d)) != 0 {
		t.Fatalf("failed group left %d snapshots, %d groups", len(allSnapshots(d)), len(allGroups(d)))
	}
	entries, _ := os.ReadDir(snapshotsDir(d))
	if len(entries) != 0 {
		t.Fatalf("failed group left data: %v", entries)
	}
	for _, tc := range []*csi.CreateVolumeGroupSnapshotRequest{{Name: "x"}, {SourceVolumeIds: []string{a}}, {Name: "x", SourceVolumeIds: []string{a, a}},
		{Name: "x", SourceVolumeIds: []string{a}, Parameters: map[string]string{"compresion": "zstd"}}} { //nolint:misspell // a misspelt key, which must be refused
		_, err := d.CreateVolumeGroupSnapshot(ctx, tc)
		wantCode(t, err, codes.InvalidArgument)
	}
	// The Kubernetes e2e framework puts a class's deletionPolicy among its
	// parameters: taken, and ignored.
	if _, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "with-policy", SourceVolumeIds: []string{a},
		Parameters: map[string]string{"deletionPolicy": "Retain"}}); err != nil {
		t.Fatalf("a group with the e2e framework's deletionPolicy parameter: %v", err)
	}
}
