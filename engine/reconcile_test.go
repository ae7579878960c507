package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// The engine's own tests of what start does with a state dir: restarts,
// the states a crash leaves, orphans. They drive the engine directly; the
// csi package's tests drive the same paths through the protocol and check
// the codes a CO sees.

var bg = context.Background()

func testConfig(t *testing.T) Config {
	return Config{
		DriverName: "test.hostpath.csi", Version: "test", NodeID: "node-1",
		StateDir: filepath.Join(t.TempDir(), "state"), MaxVolumeSize: 1 << 40,
		EnableTopology: true, EnableVolumeExpansion: true,
	}
}

// openEngine starts an engine on cfg's state dir; it is closed when the
// test ends (a second Close is harmless to the test).
func openEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := Open(cfg, func(string, int64) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// makeVolume makes an empty volume of access (AccessMount or AccessBlock)
// in the default pool, as CreateVolume does after its checks.
func makeVolume(t *testing.T, e *Engine, name, access string, size int64) VolumeRecord {
	t.Helper()
	p, err := e.ChoosePool(nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.MakeVolume(bg, VolumeSpec{Name: name, Access: access, Pool: p, Capacity: SizeRange{Required: size}})
	if err != nil {
		t.Fatal(err)
	}
	if access == AccessBlock {
		t.Cleanup(func() { DetachAll(e.VolumeDataPath(v)) })
	}
	return v
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

// TestRestartKeepsVolumes restarts the engine on the same state dir: the
// records, the data and the name index are all there.
func TestRestartKeepsVolumes(t *testing.T) {
	cfg := testConfig(t)
	e := openEngine(t, cfg)
	v := makeVolume(t, e, "pvc-keep", AccessMount, 1<<20)
	if err := os.WriteFile(filepath.Join(e.Paths.VolumeDir(v.ID), "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e2 := openEngine(t, cfg)
	got, ok := e2.Records.Volumes.Get(v.ID)
	if !ok || got.CapacityBytes != 1<<20 || got.Phase != PhaseReady {
		t.Fatalf("record after restart: %+v %v", got, ok)
	}
	if b, err := os.ReadFile(filepath.Join(e2.Paths.VolumeDir(v.ID), "f")); err != nil || string(b) != "data" {
		t.Fatalf("data lost: %q %v", b, err)
	}
	if again := makeVolume(t, e2, "pvc-keep", AccessMount, 1<<20); again.ID != v.ID {
		t.Fatal("name index lost across restart")
	}
}

// TestReconcile plants the states a crash can leave and checks that start
// repairs each one, and keeps (and counts) what no record owns.
func TestReconcile(t *testing.T) {
	cfg := testConfig(t)
	e := openEngine(t, cfg)
	keep := makeVolume(t, e, "pvc-ok", AccessMount, 1<<20)
	lost := makeVolume(t, e, "pvc-lost", AccessMount, 1<<20)
	if err := os.RemoveAll(e.Paths.VolumeDir(lost.ID)); err != nil {
		t.Fatal(err)
	}
	gone := makeVolume(t, e, "pvc-deleting", AccessMount, 1<<20)
	// The records planted by hand stand for durable state: the engine
	// stops (its journal checkpointed) before they are written.
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(e.Paths.Meta(), "volumes")
	// A create interrupted after its record and part of its data.
	half := VolumeRecord{ID: e.NewVolumeID(), Name: "pvc-half", CapacityBytes: 1 << 20, AccessType: AccessMount, Phase: PhaseCreating, CreatedAt: time.Now()}
	writeJSON(t, filepath.Join(meta, half.ID+".json"), half)
	os.MkdirAll(filepath.Join(e.Paths.VolumeDir(half.ID), "partial"), 0o755)
	// A delete interrupted after its record said so.
	gone.Phase = PhaseDeleting
	writeJSON(t, filepath.Join(meta, gone.ID+".json"), gone)
	// Data without a record (no crash leaves it: kept), a temp file, a
	// record's temp file, a stranger's file.
	orphan := e.NewVolumeID()
	os.MkdirAll(e.Paths.VolumeDir(orphan), 0o755)
	os.WriteFile(filepath.Join(e.Paths.Tmp(), "snap-x.partial"), []byte("x"), 0o600)
	os.WriteFile(filepath.Join(meta, ".vol-x.json.tmp-1"), []byte("{"), 0o600)
	stranger := filepath.Join(e.Paths.Volumes(), "not-ours")
	os.WriteFile(stranger, nil, 0o600)

	e2 := openEngine(t, cfg)
	// A ready volume whose data is missing keeps its record (the csi
	// package's TestMissingDataComesBack).
	got := map[string]bool{}
	for _, v := range e2.Records.Volumes.All() {
		got[v.ID] = true
	}
	if len(got) != 2 || !got[keep.ID] || !got[lost.ID] {
		t.Fatalf("after reconcile volumes are %v, want %s and %s", got, keep.ID, lost.ID)
	}
	for _, p := range []string{e.Paths.VolumeDir(half.ID), e.Paths.VolumeDir(gone.ID), filepath.Join(e.Paths.Tmp(), "snap-x.partial"), filepath.Join(meta, ".vol-x.json.tmp-1")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived reconcile", p)
		}
	}
	for _, p := range []string{stranger, e.Paths.VolumeDir(orphan)} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("reconcile removed %s, which no record owns: %v", p, err)
		}
	}
	// The orphan's name is one of this driver's ids: it is counted. The
	// stranger's is not, so it is only logged.
	if n := e2.Unowned.Load(); n != 1 {
		t.Errorf("start counted %d unowned entries, want 1 (the orphan)", n)
	}
}

// TestOrphanBlockFiles: an empty block volume's file made and attached
// beside its record's commit, and a crash before the commit: start lets
// its loop device go and removes it, since it holds no written data. A
// block file without a record that holds data is kept, also when the data
// is still in the cache of a loop device bound to it.
func TestOrphanBlockFiles(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	e := openEngine(t, cfg)
	file := func() string { return filepath.Join(e.Paths.Volumes(), e.NewVolumeID()+".img") }
	bound := file()
	if err := fsops.CreateBackingFile(bound, 1<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := loop.Attach(bound, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	written := file()
	if err := fsops.CreateBackingFile(written, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(written, make([]byte, 4096), 0o600); err != nil { // zeros, but written
		t.Fatal(err)
	}
	// Written through a loop device that a writer still holds open: the
	// write is in the device's cache, not yet in the file, whose extents
	// say it is empty until the device is flushed.
	held := file()
	if err := fsops.CreateBackingFile(held, 1<<20); err != nil {
		t.Fatal(err)
	}
	heldDev, err := loop.Attach(held, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(heldDev) })
	w, err := os.OpenFile(heldDev.Path(), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt([]byte("a pod's write"), 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	openEngine(t, cfg)
	if _, err := os.Stat(bound); !os.IsNotExist(err) {
		t.Errorf("%s survived reconcile", bound)
	}
	if _, err := os.Stat(held); err != nil {
		t.Errorf("a block file whose loop device held a write was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev.Path()), "loop", "backing_file")); !os.IsNotExist(err) {
		t.Errorf("the orphan's loop device %s is still bound: %v", dev.Path(), err)
	}
	if _, err := os.Stat(written); err != nil {
		t.Errorf("a block file holding written data was removed: %v", err)
	}
}

// TestFreshBlockVolumeAfterPowerLoss: an empty block volume's backing file
// is not fsynced at create; a power loss may take it, or its size, before
// any pod had it. Start makes it again, whole and allocated, and attaches
// it.
func TestFreshBlockVolumeAfterPowerLoss(t *testing.T) {
	testutil.RequireRoot(t)
	for _, loss := range []string{"file", "size", "grown"} {
		t.Run(loss, func(t *testing.T) {
			cfg := testConfig(t)
			e := openEngine(t, cfg)
			rec := makeVolume(t, e, "pvc-fresh", AccessBlock, 8<<20)
			if !rec.Fresh {
				t.Fatal("a new empty block volume is not marked fresh")
			}
			devs, err := e.BlockDevices(rec)
			if err != nil || len(devs) != 1 {
				t.Fatalf("devices %v %v", devs, err)
			}
			if err := loop.Detach(devs[0]); err != nil {
				t.Fatal(err)
			}
			path := e.VolumeDataPath(rec)
			want := int64(8 << 20)
			switch loss {
			case "file":
				os.Remove(path)
			case "size":
				os.Truncate(path, 0)
			case "grown": // an expansion that a crash stopped before its record
				want = 16 << 20
				os.Truncate(path, want)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e2 := openEngine(t, cfg)
			var st unix.Stat_t
			if err := unix.Stat(path, &st); err != nil || st.Size != want || st.Blocks*512 < want {
				t.Fatalf("backing file after start: size %d, %d bytes allocated, %v", st.Size, st.Blocks*512, err)
			}
			rec, _ = e2.Records.Volumes.Get(rec.ID)
			if rec.Fresh {
				t.Fatal("still fresh after start made its file durable")
			}
			if devs, err := e2.BlockDevices(rec); err != nil || len(devs) != 1 {
				t.Fatalf("devices after start %v %v", devs, err)
			}
		})
	}
}

// TestOpenRefuses: a state dir that cannot be made, or no node id, stops
// the engine at start.
func TestOpenRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"unusable state dir", func(c *Config) { c.StateDir = "/proc/no-such-dir/state" }},
		{"no node id", func(c *Config) { c.NodeID = "" }},
		{"unknown default layout", func(c *Config) { c.DefaultLayout = "lvm" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			tc.edit(&cfg)
			if e, err := Open(cfg, nil); err == nil {
				e.Close()
				t.Fatal("accepted")
			}
		})
	}
}
