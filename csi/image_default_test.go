package csi

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"google.golang.org/grpc/codes"
)

// TestDefaultLayout: a class that names no layout gets --default-layout
// for a new mount volume, and its source's layout for a restore or clone,
// so a clone of a directory volume made before the default changed is
// still a directory volume; a capability naming a file system image
// volumes do not hold (not ext4 or xfs) stays a directory volume; a repeated request matches the
// volume it made whatever the default is now.
func TestDefaultLayout(t *testing.T) {
	testutil.RequireRoot(t) // image volumes: loop devices
	cfg := testConfig(t)
	cfg.DefaultLayout = engine.LayoutImage
	d := newDriver(t, cfg)
	dirParams := map[string]string{engine.ParamLayout: engine.LayoutDirectory}
	xfs, btrfs := fsCap("xfs"), fsCap("btrfs")
	ext4 := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	ext4.GetMount().FsType = "ext4"

	made := map[string]string{} // name → volume id
	create := func(t *testing.T, name string, params map[string]string, c *csi.VolumeCapability, src *csi.VolumeContentSource) string {
		t.Helper()
		r := createReq(name, 16<<20)
		r.Parameters, r.VolumeContentSource, r.VolumeCapabilities = params, src, []*csi.VolumeCapability{c}
		v, err := d.CreateVolume(ctx, r)
		if err != nil {
			t.Fatalf("CreateVolume %s: %v", name, err)
		}
		id := v.GetVolume().GetVolumeId()
		if _, ok := made[name]; !ok {
			made[name] = id
			file := filepath.Join(volumesDir(d), id+engine.BlockSuffix)
			t.Cleanup(func() {
				if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
					t.Errorf("deleting %s: %v", id, err)
					engine.DetachAll(file)
				}
			})
		}
		return id
	}
	snapshot := func(t *testing.T, name, vol string) *csi.VolumeContentSource {
		t.Helper()
		s, err := d.CreateSnapshot(ctx, snapReq(name, vol, nil))
		if err != nil {
			t.Fatalf("CreateSnapshot %s: %v", name, err)
		}
		id := s.GetSnapshot().GetSnapshotId()
		t.Cleanup(func() { d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}) })
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	}
	clone := func(id string) *csi.VolumeContentSource {
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}

	dir := create(t, "dir", dirParams, rwo, nil)
	img := create(t, "img", nil, rwo, nil)
	for _, tc := range []struct {
		name   string
		params map[string]string
		cap    *csi.VolumeCapability
		src    func() *csi.VolumeContentSource
		want   string // the record's layout; "" for a block volume
	}{
		{"no layout named: the default", nil, rwo, nil, engine.LayoutImage},
		{"fs_type ext4, no layout named", nil, ext4, nil, engine.LayoutImage},
		{"fs_type xfs, no layout named: an XFS image", nil, xfs, nil, engine.LayoutImage},
		{"fs_type btrfs, no layout named: a directory", nil, btrfs, nil, engine.LayoutDirectory},
		{"layout named directory", dirParams, rwo, nil, engine.LayoutDirectory},
		{"block", nil, blockCap(), nil, ""},
		{"clone of a directory volume", nil, rwo, func() *csi.VolumeContentSource { return clone(dir) }, engine.LayoutDirectory},
		{"clone of an image volume", nil, rwo, func() *csi.VolumeContentSource { return clone(img) }, engine.LayoutImage},
		{"restore of a directory volume's snapshot", nil, rwo, func() *csi.VolumeContentSource { return snapshot(t, "dirsnap", dir) }, engine.LayoutDirectory},
		{"restore of an image volume's snapshot", nil, rwo, func() *csi.VolumeContentSource { return snapshot(t, "imgsnap", img) }, engine.LayoutImage},
		{"a directory volume's snapshot into a class naming image", imageParams, rwo, func() *csi.VolumeContentSource { return snapshot(t, "dirsnap2", dir) }, engine.LayoutImage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var src *csi.VolumeContentSource
			if tc.src != nil {
				src = tc.src()
			}
			name := strings.ReplaceAll(tc.name, " ", "-")
			id := create(t, name, tc.params, tc.cap, src)
			rec, ok := volumeRec(d, id)
			if !ok {
				t.Fatalf("no record of %s", id)
			}
			if got := rec.Layout; (got == engine.LayoutImage) != (tc.want == engine.LayoutImage) {
				t.Fatalf("layout %q, want %q", got, tc.want)
			}
			if tc.cap == xfs && rec.FSType != engine.FSXFS {
				t.Fatalf("file system %q recorded, want xfs", rec.FSType)
			}
			if tc.want == "" && rec.AccessType != engine.AccessBlock {
				t.Fatalf("a %s volume, want block", rec.AccessType)
			}
		})
	}

	// The same request again, after the default changed under it (a
	// restart with another --default-layout): the volume it made.
	d.eng.Config.DefaultLayout = engine.LayoutDirectory
	if again := create(t, "img", nil, rwo, nil); again != img {
		t.Fatalf("a repeated CreateVolume made %s, want the existing %s", again, img)
	}
	// Named, the layout must match.
	r := createReq("img", 16<<20)
	r.Parameters = dirParams
	_, err := d.CreateVolume(ctx, r)
	wantCode(t, err, codes.AlreadyExists)

	bad := testConfig(t)
	bad.DefaultLayout = "lvm"
	if _, err := New(bad); err == nil || !strings.Contains(err.Error(), "--default-layout") {
		t.Fatalf("New with --default-layout=lvm: %v, want an error naming the flag", err)
	}
}
