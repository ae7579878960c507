package csi

import (
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// blocks says whether a write to dir waits (a frozen file system) for at
// least wait; the write, if it waits, goes on in the background and is
// reported on the returned channel once it ends.
func blocks(t *testing.T, dir string, wait time.Duration) (bool, chan error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- os.WriteFile(filepath.Join(dir, "probe-"+time.Now().Format("150405.000000000")), []byte("x"), 0o644)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		return false, nil
	case <-time.After(wait):
		return true, done
	}
}

// waitWrite waits for a write that blocks reported to end.
func waitWrite(t *testing.T, done chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the write still waits: %s", what)
	}
}

// TestImageThawAtStart: a start thaws, before anything else, the file
// system a driver killed between its freeze and its thaw left frozen
// (what it leaves: its durable record of the freeze, and the frozen file
// system), and removes the record; a file system someone else froze (a
// backup tool's fsfreeze hook) is left frozen by the start, and a snapshot
// taken meanwhile is made from it as it is and leaves it frozen.
func TestImageThawAtStart(t *testing.T) {
	testutil.RequireRoot(t)
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	// The driver is restarted: what is undone at the end is undone by
	// the one running then.
	r := createReq("img", 32<<20)
	r.Parameters = imageParams
	cv, err := d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	id := cv.GetVolume().GetVolumeId()
	base := filepath.Dir(cfg.StateDir)
	staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
	unmountAll(t, staging, target)
	t.Cleanup(func() {
		fsops.ThawIfFrozen(staging)
		d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("deleting %s: %v", id, err)
		}
		engine.DetachAll(filepath.Join(volumesDir(d), id+engine.BlockSuffix))
		d.Close()
	})
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(staging, &st); err != nil {
		t.Fatal(err)
	}
	records := filepath.Join(cfg.StateDir, "freezes")

	// What a driver killed mid-snapshot leaves.
	if err := os.MkdirAll(records, 0o700); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"volume": id, "image": filepath.Join(volumesDir(d), id+engine.BlockSuffix), "dev": st.Dev, "path": staging})
	if err := os.WriteFile(filepath.Join(records, id+".json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := fsops.Freeze(staging); err != nil {
		t.Fatal(err)
	}
	waits, done := blocks(t, target, 200*time.Millisecond)
	if !waits {
		t.Fatal("a write went through a frozen file system")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, cfg)
	waitWrite(t, done, "start did not thaw the file system its record names")
	if left, _ := os.ReadDir(records); len(left) != 0 {
		t.Fatalf("freeze records left after the thaw: %v", left)
	}

	// Someone else's freeze: no record, so the start leaves it.
	if err := fsops.Freeze(staging); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	d = newDriver(t, cfg)
	waits, done = blocks(t, target, 300*time.Millisecond)
	if !waits {
		t.Fatal("start thawed a file system someone else froze")
	}
	// A snapshot of it is the frozen state, and it stays frozen.
	s, err := d.CreateSnapshot(ctx, snapReq("hooked", id, nil))
	if err == nil {
		t.Cleanup(func() { d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshot().GetSnapshotId()}) })
	}
	if err != nil {
		t.Fatalf("a snapshot of a volume a hook froze: %v", err)
	}
	if still, _ := blocks(t, target, 300*time.Millisecond); !still {
		t.Fatal("the snapshot thawed the hook's freeze")
	}
	if testutil.HaveTools(t, "e2fsck") {
		r, _ := snapshotRec(d, s.GetSnapshot().GetSnapshotId())
		if err := run("e2fsck", "-fn", d.eng.SnapshotDataPath(r)); err != nil {
			t.Fatalf("the snapshot of a hook-frozen volume is not clean: %v", err)
		}
	}
	if err := fsops.Thaw(staging); err != nil { // the hook's post-hook
		t.Fatal(err)
	}
	waitWrite(t, done, "after the hook's thaw")
}

// TestImageStageWaitsForTheCut: a snapshot that found its image volume
// unmounted copies it without a freeze, so while that copy runs the
// volume cannot be staged (Aborted: kubelet retries); once it is done the
// stage goes through. Without that, a pod's writes during the copy tear
// the snapshot's file system (a copy of seconds on an ext4 pool).
func TestImageStageWaitsForTheCut(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "ext4", 2<<30, nil, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	v := createImage(t, d, "img", 1<<30, nil)
	id := v.GetVolumeId()
	staging, target := stageAndPublish(t, d, id)
	if err := writeMiB(filepath.Join(target, "data"), 512); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	for round := 0; ; round++ {
		if round == 5 {
			t.Fatal("five snapshots ended before their copy was seen running")
		}
		errs := make(chan error, 1)
		go func() {
			// Until ready: a snapshot still being made when the test
			// ends would hold its volume past the cleanup's delete.
			_, err := testutil.SnapshotReady(ctx, d.CreateSnapshot, snapReq("cut-"+string(rune('a'+round)), id, nil))
			errs <- err
		}()
		seen := false
		var stageErr error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !seen; time.Sleep(time.Millisecond) {
			for _, b := range opSeries(t, d, "hostpath_operation_bytes_done", "snapshot") {
				if b > 0 {
					seen = true
					_, stageErr = d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo})
				}
			}
			if len(errs) > 0 {
				break
			}
		}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if !seen {
			continue
		}
		if status.Code(stageErr) != codes.Aborted || !strings.Contains(stageErr.Error(), "being cut") {
			t.Fatalf("NodeStage during the copy of the unmounted volume: %v, want Aborted", stageErr)
		}
		break
	}
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatalf("NodeStage after the snapshot: %v", err)
	}
	if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}

// TestImageGroupFreezeHoldsOnlyTheCopies: a group snapshot of image
// volumes archived as tar.gz, on a pool that shares blocks, keeps their
// file systems frozen only for the reflinked copies: the records before,
// the archives of the copies after the thaw. Once the copies are there
// (in the pool's tmp/), a write into a member goes through while the
// group is still being archived; and each member's archive restores the
// data the volume held. (No bound is timed: a --max-freeze shorter than
// the archives, as this test had, also refused the group when the
// machine was busy enough to stretch the syncs before the freeze.)
func TestImageGroupFreezeHoldsOnlyTheCopies(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "xfs", 2<<30, nil, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	d := newDriver(t, cfg)
	t.Cleanup(func() { d.Close() })
	var ids, targets []string
	sums := map[string][]byte{}
	for _, name := range []string{"a", "b"} {
		v := createImage(t, d, name, 128<<20, nil)
		_, target := stageAndPublish(t, d, v.GetVolumeId())
		data := make([]byte, 96<<20)
		rand.Read(data) // incompressible: gzip takes a while
		if err := os.WriteFile(filepath.Join(target, "data"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		ids, targets = append(ids, v.GetVolumeId()), append(targets, target)
		sums[v.GetVolumeId()] = data[:4096]
	}
	type made struct {
		g   *csi.CreateVolumeGroupSnapshotResponse
		err error
	}
	done := make(chan made, 1)
	go func() {
		g, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g", SourceVolumeIds: ids, Parameters: map[string]string{"format": "tar.gz"}})
		done <- made{g, err}
	}()
	cuts := filepath.Join(cfg.StateDir, "tmp", "*.cut-*.img")
	for seen := false; !seen; time.Sleep(time.Millisecond) {
		if len(done) > 0 {
			t.Fatal("the group was made before its copies were seen in tmp/: the test shows nothing")
		}
		m, _ := filepath.Glob(cuts)
		seen = len(m) > 0
	}
	wrote := make(chan error, 1)
	go func() {
		f, err := os.Create(filepath.Join(targets[1], "during"))
		if err == nil {
			err = f.Sync()
			f.Close()
		}
		wrote <- err
	}()
	var g *csi.CreateVolumeGroupSnapshotResponse
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
		if len(done) > 0 {
			t.Fatal("a write into a member went through only as the group was done: it stayed frozen while archived")
		}
		m := <-done
		if m.err != nil {
			t.Fatalf("a group archived after its thaw: %v", m.err)
		}
		g = m.g
	case m := <-done:
		t.Fatalf("the group was done (%v) before a write into a member went through: it stayed frozen while archived", m.err)
	}
	for _, s := range g.GetGroupSnapshot().GetSnapshots() {
		r := createImage(t, d, "r-"+s.GetSourceVolumeId(), 128<<20, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.GetSnapshotId()}}})
		_, tr := stageAndPublish(t, d, r.GetVolumeId())
		got, err := os.ReadFile(filepath.Join(tr, "data"))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 96<<20 || string(got[:4096]) != string(sums[s.GetSourceVolumeId()]) {
			t.Fatalf("restored member of %s holds other data (%d bytes)", s.GetSourceVolumeId(), len(got))
		}
	}
}
