package csi

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hostpath-csi/hostpath/engine"
)

// TestSourceOwnerRecorded: a snapshot keeps the VolumeSnapshot and content
// the snapshotter named, a volume the claim and PV the provisioner named,
// and a request without that metadata records no owner: the node that
// serves a source to another node trusts these records alone.
func TestSourceOwnerRecorded(t *testing.T) {
	d := newDriver(t, testConfig(t))
	req := createReq("pvc-1", 1<<20)
	req.Parameters = map[string]string{engine.MetaPVCNamespace: "app", engine.MetaPVCName: "data", engine.MetaPVName: "pvc-1"}
	r, err := d.CreateVolume(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	vol := r.GetVolume().GetVolumeId()
	bare := mustCreate(t, d, "bare", 1<<20).GetVolumeId()
	s, err := d.CreateSnapshot(ctx, snapReq("snapshot-1", vol, map[string]string{
		engine.MetaSnapshotNS: "app", engine.MetaSnapshotName: "nightly", engine.MetaSnapshotContent: "snapcontent-1"}))
	if err != nil {
		t.Fatal(err)
	}
	anon, err := d.CreateSnapshot(ctx, snapReq("snapshot-2", vol, nil))
	if err != nil {
		t.Fatal(err)
	}
	// A group's members keep the VolumeGroupSnapshot and its content.
	g, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "group-1", SourceVolumeIds: []string{bare},
		Parameters: map[string]string{engine.MetaGroupNS: "app", engine.MetaGroupName: "db", engine.MetaGroupContent: "groupcontent-1"}})
	if err != nil {
		t.Fatal(err)
	}
	member := g.GetGroupSnapshot().GetSnapshots()[0].GetSnapshotId()
	for _, c := range []struct {
		kind, id string
		here, ok bool
		want     engine.Owner
	}{
		{engine.SourceVolume, vol, true, true, engine.Owner{Namespace: "app", Name: "data", Content: "pvc-1"}},
		{engine.SourceVolume, bare, true, false, engine.Owner{}},
		{engine.SourceSnapshot, s.GetSnapshot().GetSnapshotId(), true, true, engine.Owner{Namespace: "app", Name: "nightly", Content: "snapcontent-1"}},
		{engine.SourceSnapshot, anon.GetSnapshot().GetSnapshotId(), true, false, engine.Owner{}},
		{engine.SourceSnapshot, member, true, true, engine.Owner{Namespace: "app", Name: "db", Content: "groupcontent-1", Group: true}},
		{engine.SourceSnapshot, "snap-000000000000000000000000", false, false, engine.Owner{}},
	} {
		o, here, ok := d.eng.SourceOwner(c.kind, c.id)
		if here != c.here || ok != c.ok || o != c.want {
			t.Errorf("%s %s: %+v here=%v ok=%v, want %+v here=%v ok=%v", c.kind, c.id, o, here, ok, c.want, c.here, c.ok)
		}
	}
	// The owner survives a restart (it is in the record on disk).
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d2 := newDriver(t, d.eng.Config)
	defer d2.Close()
	if o, _, ok := d2.eng.SourceOwner(engine.SourceSnapshot, s.GetSnapshot().GetSnapshotId()); !ok || o.Name != "nightly" {
		t.Fatalf("after a restart: %+v %v", o, ok)
	}
}
