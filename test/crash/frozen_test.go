package crash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

func runTool(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %w\n%s", name, args, err, out)
	}
	return nil
}

// writeWaits starts a write to dir and returns its end.
func writeWaits(dir string) chan error {
	done := make(chan error, 1)
	go func() {
		done <- os.WriteFile(filepath.Join(dir, fmt.Sprintf("w-%d", time.Now().UnixNano())), []byte("x"), 0o644)
	}()
	return done
}

// frozen tells whether the file system mounted at path is frozen, asking
// the kernel (a second FIFREEZE is EBUSY) rather than timing a write,
// which a busy machine slows as much as a freeze; one not frozen is left
// so.
func frozen(t *testing.T, path string) bool {
	t.Helper()
	err := fsops.Freeze(path)
	if errors.Is(err, unix.EBUSY) {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fsops.ThawIfFrozen(path); err != nil {
		t.Fatal(err)
	}
	return false
}

// TestKilledWhileFrozen: the real binary, killed with SIGKILL while an
// image volume's file system is frozen for a snapshot (a copy of 256 MiB
// of extents on an ext4 pool, with --max-freeze long enough to be inside
// it): the file system stays frozen while no driver runs, and the next
// start thaws it before anything else, so the pod's write goes through;
// the retried snapshot is made.
func TestKilledWhileFrozen(t *testing.T) {
	testutil.RequireRoot(t)
	pool := testfs.FileSystem(t, runTool, "ext4", 2<<30, nil, "")
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, bin: filepath.Join(dir, "hostpathplugin"), sock: filepath.Join(dir, "csi.sock"),
		state: filepath.Join(pool, "state"), args: []string{"--max-freeze=2m"}}
	if out, err := exec.Command("go", "build", "-o", h.bin, "../../cmd/hostpathplugin").CombinedOutput(); err != nil {
		t.Fatalf("build: %v %s", err, out)
	}
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	var image string
	t.Cleanup(func() {
		fsops.ThawIfFrozen(staging) // never leave a test's file system frozen
		if h.cmd != nil && h.cmd.ProcessState == nil {
			h.cmd.Process.Kill()
			h.cmd.Wait()
		}
		testutil.UnmountUnder(t, dir)
		if image != "" {
			engine.DetachAll(image)
		}
	})
	ctx := context.Background()
	h.start()
	vol, err := h.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "img", VolumeCapabilities: []*csi.VolumeCapability{rwo},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 512 << 20}, Parameters: map[string]string{engine.ParamLayout: engine.LayoutImage}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	image = filepath.Join(h.state, "volumes", id+engine.BlockSuffix)
	if _, err := h.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1<<20)
	f, err := os.Create(filepath.Join(target, "data"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 256 {
		data[0] = byte(i)
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	// A freeze's record is named by the volume and the freeze.
	records := filepath.Join(h.state, "freezes", id+".*.json")
	recorded := func() bool { m, _ := filepath.Glob(records); return len(m) > 0 }
	var held chan error
	for round := 0; ; round++ {
		if round == 5 {
			t.Fatal("five kills all landed outside the freeze")
		}
		errc := make(chan error, 1)
		go func() {
			_, err := h.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: fmt.Sprintf("s%d", round), SourceVolumeId: id})
			errc <- err
		}()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && len(errc) == 0; time.Sleep(time.Millisecond) {
			if recorded() {
				break
			}
		}
		time.Sleep(20 * time.Millisecond) // into the copy
		h.kill()
		<-errc
		if frozen(t, staging) {
			t.Logf("round %d: killed while the file system was frozen", round)
			held = writeWaits(target)
			break
		}
		h.start()
	}
	// No driver runs: the file system stays frozen.
	select {
	case err := <-held:
		t.Fatalf("the write went through with no driver running (%v)", err)
	case <-time.After(time.Second):
	}
	h.start()
	select {
	case err := <-held:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write still waits after the restart: start did not thaw the file system the killed driver froze")
	}
	if left, err := filepath.Glob(records); len(left) > 0 || err != nil {
		t.Fatalf("freeze records still there after the thaw: %v (%v)", left, err)
	}
	if _, err := h.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "after", SourceVolumeId: id}); err != nil {
		t.Fatalf("a snapshot after the restart: %v", err)
	}
	if _, err := h.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	h.kill()
}
