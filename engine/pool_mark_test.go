package engine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// run starts a test's tool (mkfs for testfs).
func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

// makeInPool makes an empty mount volume in pool, as CreateVolume does for
// a class whose pool parameter names it.
func makeInPool(t *testing.T, e *Engine, name, pool string) VolumeRecord {
	t.Helper()
	p, err := e.ChoosePool(map[string]string{ParamPool: pool})
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.MakeVolume(bg, VolumeSpec{Name: name, Access: AccessMount, Pool: p, Capacity: SizeRange{Required: 1 << 20}})
	if err != nil {
		t.Fatalf("making %s in pool %s: %v", name, pool, err)
	}
	return v
}

// deleteVolume deletes volume id, which must have been there.
func deleteVolume(t *testing.T, e *Engine, id string) {
	t.Helper()
	if _, ok := e.Records.Volumes.Get(id); !ok {
		t.Fatalf("volume %s has no record to delete", id)
	}
	if err := e.DeleteVolume(id); err != nil {
		t.Fatal(err)
	}
}

// statePool is a config whose state dir is a file system of its own, with
// pool fast on a disk of its own mounted at a directory of the test's
// (another file system): the case where an empty mount point is not on
// the state dir's file system, so only the memory of marked pools keeps
// the engine from marking it.
func statePool(t *testing.T) (cfg Config, fast string) {
	t.Helper()
	testutil.RequireRoot(t)
	cfg = testConfig(t)
	cfg.StateDir = filepath.Join(testfs.FileSystem(t, run, "ext4", 300<<20, nil, ""), "state")
	fast, _ = testfs.PoolDir(t, run, "ext4")
	cfg.Pools = map[string]string{"fast": fast}
	return cfg, fast
}

// TestPoolNeverMarkedTwice: the engine marks a pool by itself once; a
// later start that finds the pool's directory unmarked (its disk late, an
// empty mount point on another file system than the state dir's) keeps
// it down, even when no record names the pool any more (the first
// version marked it, and the pool's volumes would have landed on the
// root disk). hostpathplugin --mark-pool marks a new disk, and a running
// engine brings it up.
func TestPoolNeverMarkedTwice(t *testing.T) {
	cfg, fast := statePool(t)
	cfg.PoolRetryInterval = 20 * time.Millisecond
	e := openEngine(t, cfg)
	deleteVolume(t, e, makeInPool(t, e, "v", "fast").ID)
	e.Close()
	if err := unix.Unmount(fast, 0); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, cfg)
	if st := e.Pools["fast"].Get(); st.Down == nil || !strings.Contains(st.Down.Error(), "--mark-pool=fast") {
		t.Fatalf("pool fast on an empty mount point: %v, want down saying how to mark a new disk", st.Down)
	}
	if _, err := os.Stat(filepath.Join(fast, PoolMarker)); !os.IsNotExist(err) {
		t.Fatalf("the empty mount point was marked: %v", err)
	}

	// A new disk for the pool, marked by a person while the engine runs.
	newDisk := testfs.FileSystem(t, run, "ext4", 300<<20, nil, "")
	testfs.Bind(t, newDisk, fast)
	msg, err := MarkPool(cfg, "fast")
	if err != nil || !strings.Contains(msg, "marked as pool fast") {
		t.Fatalf("MarkPool: %q %v", msg, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for e.Pools["fast"].Get().Down != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the marked disk did not come up: %v", e.Pools["fast"].Get().Down)
		}
		time.Sleep(20 * time.Millisecond)
	}
	makeInPool(t, e, "on-the-new-disk", "fast")
}

// TestPoolNotMarkedBesideDamage: a pool the state dir does not remember
// (marked by a release that kept no memory of its pools) whose directory
// is unmarked is not marked while any record is damaged: that record may
// be the pool's (the first version counted such a pool as empty).
func TestPoolNotMarkedBesideDamage(t *testing.T) {
	cfg, fast := statePool(t)
	e := openEngine(t, cfg)
	id := makeInPool(t, e, "v", "fast").ID
	e.Close()
	os.WriteFile(filepath.Join(e.Paths.Meta(), "volumes", id+".json"), nil, 0o600)
	os.RemoveAll(e.Paths.KnownPools())
	if err := unix.Unmount(fast, 0); err != nil {
		t.Fatal(err)
	}
	e = openEngine(t, cfg)
	if st := e.Pools["fast"].Get(); st.Down == nil || !strings.Contains(st.Down.Error(), "damaged records") {
		t.Fatalf("pool fast beside a damaged record: %v, want down", st.Down)
	}
	if _, err := os.Stat(filepath.Join(fast, PoolMarker)); !os.IsNotExist(err) {
		t.Fatalf("the empty mount point was marked: %v", err)
	}
}

// TestPoolPathsResolved: pool and state dir paths are judged by what they
// name, symlinks resolved once at start: a pool given as a symlink to its
// disk comes up (the first version judged the link, on the state dir's
// file system, and kept it down); pools that overlap through a link, and
// two pools on one file system, are refused.
func TestPoolPathsResolved(t *testing.T) {
	testutil.RequireRoot(t)
	fast, disk := testfs.PoolDir(t, run, "ext4")
	links := t.TempDir()
	link := filepath.Join(links, "fast")
	if err := os.Symlink(fast, link); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	os.MkdirAll(cfg.StateDir, 0o755)
	stateLink := filepath.Join(links, "state")
	os.Symlink(cfg.StateDir, stateLink)
	cfg.StateDir, cfg.Pools = stateLink, map[string]string{"fast": link}
	e := openEngine(t, cfg)
	if st := e.Pools["fast"].Get(); st.Down != nil {
		t.Fatalf("a pool given as a symlink to its disk: %v", st.Down)
	}
	if got := e.Pools["fast"].Paths.Root; got != fast {
		t.Fatalf("pool path %s, want the link resolved to %s", got, fast)
	}
	makeInPool(t, e, "v", "fast")
	e.Close()

	// Overlap through a link.
	os.Mkdir(filepath.Join(fast, "sub"), 0o755)
	subLink := filepath.Join(links, "sub")
	os.Symlink(filepath.Join(fast, "sub"), subLink)
	cfg.Pools = map[string]string{"fast": link, "other": subLink}
	if e, err := Open(cfg, nil); err == nil || !strings.Contains(err.Error(), "overlap") {
		if e != nil {
			e.Close()
		}
		t.Fatalf("pools overlapping through a link: %v, want refused", err)
	}

	// Two pools on one file system: a directory of pool fast's disk,
	// bind-mounted elsewhere.
	os.Mkdir(filepath.Join(disk, "twin"), 0o755)
	second := testfs.PoolOn(t, filepath.Join(disk, "twin"), "twin")
	cfg.Pools = map[string]string{"fast": link, "twin": second}
	e = openEngine(t, cfg)
	if st := e.Pools["twin"].Get(); st.Down == nil || !strings.Contains(st.Down.Error(), "file system of pool fast") {
		t.Fatalf("a second pool on pool fast's file system: %v, want down", st.Down)
	}
	if e.Pools["fast"].Get().Down != nil {
		t.Fatal("pool fast went down beside its twin")
	}
}
