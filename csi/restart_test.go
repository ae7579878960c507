package csi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TestRestartKeepsVolumes restarts the driver on the same state dir.
func TestRestartKeepsVolumes(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	v := mustCreate(t, d, "pvc-keep", 1<<20)
	if err := os.WriteFile(filepath.Join(d.paths.volumeDir(v.GetVolumeId()), "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	d2 := newDriver(t, cfg)
	r, err := d2.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()})
	if err != nil || r.GetVolume().GetCapacityBytes() != 1<<20 {
		t.Fatalf("%v %v", r, err)
	}
	if b, err := os.ReadFile(filepath.Join(d2.paths.volumeDir(v.GetVolumeId()), "f")); err != nil || string(b) != "data" {
		t.Fatalf("data lost: %q %v", b, err)
	}
	if again := mustCreate(t, d2, "pvc-keep", 1<<20); again.GetVolumeId() != v.GetVolumeId() {
		t.Fatal("name index lost across restart")
	}
}

// TestReconcile plants the states a crash can leave and checks that start
// repairs each one.
func TestReconcile(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	keep := mustCreate(t, d, "pvc-ok", 1<<20)
	lost := mustCreate(t, d, "pvc-lost", 1<<20)
	if err := os.RemoveAll(d.paths.volumeDir(lost.GetVolumeId())); err != nil {
		t.Fatal(err)
	}
	// A create interrupted after its record and part of its data.
	half := volumeRecord{ID: d.newVolumeID(), Name: "pvc-half", CapacityBytes: 1 << 20, AccessType: accessMount, Phase: phaseCreating, CreatedAt: time.Now()}
	writeJSON(t, filepath.Join(d.paths.meta(), "volumes", half.ID+".json"), half)
	os.MkdirAll(filepath.Join(d.paths.volumeDir(half.ID), "partial"), 0o755)
	// A delete interrupted after its record said so.
	gone := mustCreate(t, d, "pvc-deleting", 1<<20)
	rec, _ := d.st.getVolume(gone.GetVolumeId())
	rec.Phase = phaseDeleting
	writeJSON(t, filepath.Join(d.paths.meta(), "volumes", rec.ID+".json"), rec)
	// Data without a record, a temp file, a snapshot that never finished.
	orphan := d.newVolumeID()
	os.MkdirAll(d.paths.volumeDir(orphan), 0o755)
	os.WriteFile(filepath.Join(d.paths.tmp(), "snap-x.partial"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(d.paths.meta(), "volumes", ".vol-x.json.tmp-1"), []byte("{"), 0o600)
	stranger := filepath.Join(d.paths.volumes(), "not-ours")
	os.WriteFile(stranger, nil, 0o600)

	d2 := newDriver(t, cfg)
	want := map[string]bool{keep.GetVolumeId(): true}
	got := map[string]bool{}
	for _, v := range d2.st.allVolumes() {
		got[v.ID] = true
	}
	if len(got) != 1 || !got[keep.GetVolumeId()] {
		t.Fatalf("after reconcile volumes are %v, want %v", got, want)
	}
	for _, p := range []string{d.paths.volumeDir(half.ID), d.paths.volumeDir(gone.GetVolumeId()), d.paths.volumeDir(orphan), filepath.Join(d.paths.tmp(), "snap-x.partial")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived reconcile", p)
		}
	}
	if _, err := os.Stat(stranger); err != nil {
		t.Error("reconcile removed a file the driver did not make")
	}
	if !d2.ready.Load() {
		t.Fatal("not ready after reconcile")
	}
}

func TestDamagedStateStopsStart(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	v := mustCreate(t, d, "pvc-x", 1<<20)
	os.WriteFile(filepath.Join(d.paths.meta(), "volumes", v.GetVolumeId()+".json"), []byte("{garbage"), 0o600)
	if _, err := New(cfg); err == nil {
		t.Fatal("a damaged record must stop the start, not be skipped")
	}
}

func TestStateDirProblems(t *testing.T) {
	cfg := testConfig(t)
	cfg.StateDir = "/proc/no-such-dir/state"
	if _, err := New(cfg); err == nil {
		t.Fatal("unusable state dir accepted")
	}
	cfg = testConfig(t)
	cfg.NodeID = ""
	if _, err := New(cfg); err == nil {
		t.Fatal("missing node id accepted")
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
