package csi

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func testConfig(t *testing.T) engine.Config {
	return engine.Config{
		DriverName: "test.hostpath.csi", Version: "test", NodeID: "node-1",
		StateDir: filepath.Join(t.TempDir(), "state"), MaxVolumeSize: 1 << 40,
		EnableTopology: true, EnableVolumeExpansion: true,
		// The freeze bound is a test's subject only where it sets its
		// own: a busy machine's syncs must not refuse other cuts.
		MaxFreeze: time.Minute,
		// Likewise the background: a busy machine's archive must not
		// leave a test's snapshot not ready (the tests of the
		// background set the default second).
		SnapshotReadyGrace: time.Minute,
	}
}

func newDriver(t *testing.T, cfg engine.Config) *Driver {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

var ctx = context.Background()

// defaultPool is the state of the state dir's own pool.
func (d *Driver) defaultPool() *engine.PoolState { return poolNow(d, engine.DefaultPool) }

func mountCap(mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

var rwo = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func createReq(name string, size int64) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: size}}
}

func mustCreate(t *testing.T, d *Driver, name string, size int64) *csi.Volume {
	t.Helper()
	r, err := d.CreateVolume(ctx, createReq(name, size))
	if err != nil {
		t.Fatal(err)
	}
	return r.GetVolume()
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
}

func TestCreateVolumeValidation(t *testing.T) {
	d := newDriver(t, testConfig(t))
	long := make([]byte, 5000)
	for i := range long {
		long[i] = 'a'
	}
	multi := mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	tests := []struct {
		name string
		req  *csi.CreateVolumeRequest
		code codes.Code
	}{
		{"no name", createReq("", 1<<20), codes.InvalidArgument},
		{"5000-byte name", createReq(string(long), 1<<20), codes.InvalidArgument},
		{"invalid utf-8", createReq("a\xffb", 1<<20), codes.InvalidArgument},
		{"NUL in name", createReq("a\x00b", 1<<20), codes.InvalidArgument},
		{"no capabilities", &csi.CreateVolumeRequest{Name: "x"}, codes.InvalidArgument},
		{"multi-node writer", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{multi}}, codes.InvalidArgument},
		{"block and mount", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo, blockCap()}}, codes.InvalidArgument},
		{"bad mount flag", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "data=ordered")}}, codes.InvalidArgument},
		{"required above limit", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 10, LimitBytes: 5}}, codes.InvalidArgument},
		{"negative size", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: -1}}, codes.InvalidArgument},
		{"above max volume size", createReq("x", 2<<40), codes.OutOfRange},
		{"unknown parameter", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"fsType": "xfs"}}, codes.InvalidArgument},
		{"kind without --capacity", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo}, Parameters: map[string]string{"kind": "fast"}}, codes.InvalidArgument},
		{"snapshot source not found", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "../../etc"}}}}, codes.NotFound},
		{"volume source not found", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: d.eng.NewVolumeID()}}}}, codes.NotFound},
		{"volume source on another node", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: engine.NewID(engine.VolumeIDPrefix, engine.NodeTag("node-2"))}}}}, codes.ResourceExhausted},
		{"snapshot source on another node", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: engine.NewID(engine.SnapshotIDPrefix, engine.NodeTag("node-2"))}}}}, codes.ResourceExhausted},
		{"topology elsewhere", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{rwo},
			AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{TopologyKey: "node-2"}}}}}, codes.ResourceExhausted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.CreateVolume(ctx, tc.req)
			wantCode(t, err, tc.code)
		})
	}
	entries, err := volumeData(d)
	if err != nil || len(entries) != 0 {
		t.Fatalf("refused requests left data behind: %v %v", entries, err)
	}
}

func TestCreateVolumeIdempotent(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v1 := mustCreate(t, d, "pvc-1", 10<<20)
	v2 := mustCreate(t, d, "pvc-1", 10<<20)
	if v1.GetVolumeId() != v2.GetVolumeId() {
		t.Fatalf("same name gave two volumes: %s %s", v1.GetVolumeId(), v2.GetVolumeId())
	}
	_, err := d.CreateVolume(ctx, createReq("pvc-1", 20<<20))
	wantCode(t, err, codes.AlreadyExists)
	// Within the range: the volume of 10 MiB satisfies required 5 MiB.
	if v3 := mustCreate(t, d, "pvc-1", 5<<20); v3.GetVolumeId() != v1.GetVolumeId() {
		t.Fatal("compatible smaller request got a new volume")
	}
	if fi, err := os.Stat(volumeDir(d, v1.GetVolumeId())); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("volume dir: %v %v", fi, err)
	}
	if v1.GetAccessibleTopology()[0].GetSegments()[TopologyKey] != "node-1" {
		t.Fatalf("topology: %v", v1.GetAccessibleTopology())
	}
}

func TestCreateVolumeConcurrentSameName(t *testing.T) {
	d := newDriver(t, testConfig(t))
	var wg sync.WaitGroup
	got := make(chan string, 32)
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := d.CreateVolume(ctx, createReq("same", 1<<20))
			switch status.Code(err) {
			case codes.OK:
				got <- r.GetVolume().GetVolumeId()
			case codes.Aborted:
			default:
				t.Errorf("unexpected error %v", err)
			}
		}()
	}
	wg.Wait()
	close(got)
	seen := map[string]bool{}
	for id := range got {
		seen[id] = true
	}
	if len(seen) != 1 || len(allVolumes(d)) != 1 {
		t.Fatalf("concurrent creates of one name made %d ids, %d records", len(seen), len(allVolumes(d)))
	}
}

func TestDeleteVolume(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "pvc-del", 1<<20)
	for _, id := range []string{"unknown", engine.NewID(engine.VolumeIDPrefix, d.eng.Tag), "../../../etc", "vol-" + v.GetVolumeId()} {
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("delete of %q: %v", id, err)
		}
	}
	if _, err := os.Stat(volumeDir(d, v.GetVolumeId())); err != nil {
		t.Fatal("deleting unknown ids touched a real volume")
	}
	_, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
	wantCode(t, err, codes.InvalidArgument)
	for i := 0; i < 2; i++ {
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(volumeDir(d, v.GetVolumeId())); !os.IsNotExist(err) {
		t.Fatalf("volume dir still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(metaDir(d), "volumes", v.GetVolumeId()+".json")); !os.IsNotExist(err) {
		t.Fatalf("record still there: %v", err)
	}
}

func TestListVolumesPagination(t *testing.T) {
	d := newDriver(t, testConfig(t))
	for i := 0; i < 7; i++ {
		mustCreate(t, d, "pvc-list-"+string(rune('a'+i)), 1<<20)
	}
	r, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 3})
	if err != nil || len(r.GetEntries()) != 3 || r.GetNextToken() == "" {
		t.Fatalf("first page: %v %v", r, err)
	}
	// Delete what the first page returned: the token must stay valid.
	for _, e := range r.GetEntries() {
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: e.GetVolume().GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	}
	r2, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: r.GetNextToken()})
	if err != nil || len(r2.GetEntries()) != 4 || r2.GetNextToken() != "" {
		t.Fatalf("second page after deletes: %d entries, next %q, %v", len(r2.GetEntries()), r2.GetNextToken(), err)
	}
	for _, tok := range []string{"0", "-1", "18446744073709551616", "vol-zzz"} {
		_, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: tok})
		wantCode(t, err, codes.Aborted)
	}
}

func TestGetCapacity(t *testing.T) {
	d := newDriver(t, testConfig(t))
	r1, err := d.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || r1.GetAvailableCapacity() <= 0 {
		t.Fatalf("%v %v", r1, err)
	}
	mustCreate(t, d, "pvc-cap", 1<<30)
	r2, _ := d.GetCapacity(ctx, &csi.GetCapacityRequest{})
	// Other processes write too; the reservation must show, give or take.
	if diff := r1.GetAvailableCapacity() - r2.GetAvailableCapacity(); diff < 900<<20 {
		t.Fatalf("a 1 GiB volume reduced capacity by only %d bytes", diff)
	}
	other, _ := d.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyKey: "elsewhere"}}})
	if other.GetAvailableCapacity() != 0 {
		t.Fatal("another node's topology has capacity here")
	}
}

func TestSimulatedCapacity(t *testing.T) {
	cfg := testConfig(t)
	cfg.Capacity = map[string]int64{"fast": 10 << 20, "slow": 20 << 20}
	d := newDriver(t, cfg)
	req := func(name, kind string, size int64) *csi.CreateVolumeRequest {
		r := createReq(name, size)
		if kind != "" {
			r.Parameters = map[string]string{"kind": kind}
		}
		return r
	}
	if _, err := d.CreateVolume(ctx, req("a", "fast", 8<<20)); err != nil {
		t.Fatal(err)
	}
	_, err := d.CreateVolume(ctx, req("b", "fast", 8<<20))
	wantCode(t, err, codes.ResourceExhausted)
	if _, err := d.CreateVolume(ctx, req("c", "", 15<<20)); err != nil {
		t.Fatalf("no kind given should pick slow: %v", err)
	}
	c, _ := d.GetCapacity(ctx, &csi.GetCapacityRequest{Parameters: map[string]string{"kind": "slow"}})
	if c.GetAvailableCapacity() != 5<<20 {
		t.Fatalf("slow has %d left, want %d", c.GetAvailableCapacity(), 5<<20)
	}
}

func TestExpandVolume(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "pvc-exp", 10<<20)
	r, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 20 << 20}})
	if err != nil || r.GetCapacityBytes() != 20<<20 {
		t.Fatalf("%v %v", r, err)
	}
	r, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 5 << 20}})
	if err != nil || r.GetCapacityBytes() != 20<<20 {
		t.Fatalf("smaller request should be satisfied by the current size: %v %v", r, err)
	}
	_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 5 << 20, LimitBytes: 5 << 20}})
	wantCode(t, err, codes.OutOfRange)
	_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 40}})
	wantCode(t, err, codes.OutOfRange)
	_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: d.eng.NewVolumeID(), CapacityRange: &csi.CapacityRange{RequiredBytes: 1}})
	wantCode(t, err, codes.NotFound)
}

func TestValidateVolumeCapabilities(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "pvc-vvc", 1<<20)
	tests := []struct {
		name      string
		caps      []*csi.VolumeCapability
		confirmed bool
	}{
		{"single node writer", []*csi.VolumeCapability{rwo}, true},
		{"read only", []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)}, true},
		{"multi node writer", []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)}, false},
		{"multi node reader", []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)}, false},
		{"block on a mount volume", []*csi.VolumeCapability{blockCap()}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.GetVolumeId(), VolumeCapabilities: tc.caps})
			if err != nil {
				t.Fatal(err)
			}
			if (r.GetConfirmed() != nil) != tc.confirmed {
				t.Fatalf("confirmed=%v, want %v (%s)", r.GetConfirmed() != nil, tc.confirmed, r.GetMessage())
			}
			if !tc.confirmed && r.GetMessage() == "" {
				t.Fatal("an unconfirmed answer must say why")
			}
		})
	}
}

// TestHeavySlots: with every heavy slot taken, a snapshot waits for one
// past its request (Aborted, the snapshot being made), a retry is told so
// at once, and once a slot is free the snapshot is made and a retry
// returns it.
func TestHeavySlots(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxHeavyOps = 1
	d := newDriver(t, cfg)
	release, err := d.eng.Heavy.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, d, "v", 1<<20)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = d.CreateSnapshot(short, snapReq("s", v.GetVolumeId(), nil))
	wantCode(t, err, codes.Aborted)
	start := time.Now()
	_, err = d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), nil))
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "is being made") || time.Since(start) > 5*time.Second {
		t.Fatalf("a retry while the snapshot waits for a slot: %v after %v, want Aborted at once, saying it is being made", err, time.Since(start))
	}
	release()
	// Until ready: one still being made when the test ends would write
	// into its directory while the cleanup removes it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), nil))
		if err == nil && r.GetSnapshot().GetReadyToUse() {
			break
		}
		if err == nil && time.Now().Before(deadline) {
			continue
		}
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			t.Fatalf("the snapshot once a slot is free: %v", err)
		}
	}
}

// volumeData lists the volumes directory but the marker that says it is
// the volumes' home.
func volumeData(d *Driver) ([]os.DirEntry, error) {
	entries, err := os.ReadDir(volumesDir(d))
	return slices.DeleteFunc(entries, func(e os.DirEntry) bool { return e.Name() == engine.VolumesMarker }), err
}
