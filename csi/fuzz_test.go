package csi

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// FuzzPaginationToken: any token is a page or Aborted, never a panic or a
// repeated entry.
func FuzzPaginationToken(f *testing.F) {
	for _, s := range []string{"", "0", "-1", "99999999999999999999", "vol-0a0b0c0d0000000000000001", "vol-", "invalid-token", "\x00", "vol-0a0b0c0d000000000000000Z"} {
		f.Add(s, int32(2))
	}
	all := ids(7)
	f.Fuzz(func(t *testing.T, token string, max int32) {
		page, next, err := paginate(all, token, max, engine.ValidVolumeID, func(s string) string { return s })
		if err != nil {
			if c := status.Code(err); c != codes.Aborted && c != codes.InvalidArgument {
				t.Fatalf("token %q: code %v", token, c)
			}
			return
		}
		seen := map[string]bool{}
		for _, p := range page {
			if seen[p] || (token != "" && p <= token) {
				t.Fatalf("token %q gave %v", token, page)
			}
			seen[p] = true
		}
		if next != "" && next != page[len(page)-1] {
			t.Fatalf("next %q is not the page's last id", next)
		}
	})
}

// FuzzIDsAndNames: validation never panics, and an id that passes is safe
// to use as one path component.
func FuzzIDsAndNames(f *testing.F) {
	for _, s := range []string{"vol-0123456789abcdef01234567", "../../etc/passwd", "/abs", "a\x00b", strings.Repeat("x", 5000), "\xff\xfe", "snap-0123456789abcdef01234567"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_ = checkName("name", s)
		_ = checkID("id", s)
		if engine.ValidVolumeID(s) || engine.ValidSnapshotID(s) || engine.ValidGroupID(s) {
			if strings.ContainsAny(s, "/\x00") || s == "." || s == ".." || strings.Contains(s, "..") {
				t.Fatalf("%q accepted as an id", s)
			}
		}
		_, _ = engine.ParseQuantity(s)
	})
}

// FuzzCreateVolume: requests built from fuzzed fields get a gRPC code a
// CO can act on, never Internal or a panic, and never leave data behind
// when refused.
func FuzzCreateVolume(f *testing.F) {
	f.Add("pvc-1", int64(1<<20), int64(0), "kind", "x", "", "")
	f.Add("", int64(-1), int64(5), "fsType", "ext4", "vol-0a0b0c0d0000000000000001", "")
	f.Add("n", int64(10), int64(1), "csi.storage.k8s.io/pvc/name", "p", "", "snap-../../x")
	cfg := engine.Config{DriverName: "fuzz", Version: "t", NodeID: "n", StateDir: f.TempDir(), MaxVolumeSize: 1 << 30}
	d, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string, req, lim int64, pk, pv, srcVol, srcSnap string) {
		r := &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo},
			CapacityRange: &csi.CapacityRange{RequiredBytes: req % (1 << 30), LimitBytes: lim % (1 << 30)}, Parameters: map[string]string{pk: pv}}
		switch {
		case srcVol != "":
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: srcVol}}}
		case srcSnap != "":
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: srcSnap}}}
		}
		resp, err := d.CreateVolume(ctx, r)
		switch status.Code(err) {
		case codes.OK:
			d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()})
		case codes.InvalidArgument, codes.OutOfRange, codes.NotFound, codes.AlreadyExists, codes.ResourceExhausted, codes.Aborted:
		default:
			t.Fatalf("code %v: %v", status.Code(err), err)
		}
	})
}
