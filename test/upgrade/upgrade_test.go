// Package upgrade runs the previous release's driver (the commit in
// PREVIOUS_RELEASE, built through a git worktree) and the current one on
// the same state dir, as a DaemonSet upgrade and a rollback do: what the
// previous one made is served by the current one with the same bytes, and
// the previous one, started again on what the current one wrote, either
// serves it or refuses with one line, never damaging it.
package upgrade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %w\n%s", name, args, err, out)
	}
	return nil
}

// previousCommit is the commit PREVIOUS_RELEASE names.
func previousCommit(t *testing.T) string {
	b, err := os.ReadFile("../../PREVIOUS_RELEASE")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if c, ok := strings.CutPrefix(l, "commit "); ok {
			return strings.TrimSpace(c)
		}
	}
	t.Fatal("PREVIOUS_RELEASE names no commit")
	return ""
}

// buildAt builds the driver at commit (through a git worktree, removed
// afterwards), or the working tree's when commit is "".
func buildAt(t *testing.T, commit string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "hostpathplugin")
	src, _ := filepath.Abs("../..")
	if commit != "" {
		wt := filepath.Join(t.TempDir(), "previous")
		if err := run("git", "-C", src, "worktree", "add", "--detach", wt, commit); err != nil {
			t.Fatal(err)
		}
		defer run("git", "-C", src, "worktree", "remove", "--force", wt)
		src = wt
	}
	cmd := exec.Command("go", "build", "-o", out, "./cmd/hostpathplugin")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", commit, err, b)
	}
	return out
}

// driver is one run of a binary on the state dir.
type driver struct {
	cmd  *exec.Cmd
	logs *bytes.Buffer
	cc   *grpc.ClientConn
	done chan error
}

func start(t *testing.T, bin, state, sock string) *driver {
	t.Helper()
	d := &driver{logs: &bytes.Buffer{}, done: make(chan error, 1)}
	d.cmd = exec.Command(bin, "--endpoint=unix://"+sock, "--nodeid=upgrade-node", "--statedir="+state,
		"--enable-controller-modify-volume", "--enable-snapshot-metadata")
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	// A failed check must not leave the driver running (it holds the
	// test's file system): killed at the end unless stopped before. The
	// world's cleanup, registered later, runs first.
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill()
			<-d.done
		}
	})
	var err error
	if d.cc, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	return d
}

// ready waits until the driver answers Probe, or returns its exit.
func (d *driver) ready(t *testing.T) error {
	t.Helper()
	var exit error
	exited := func() bool {
		select {
		case exit = <-d.done:
			return true
		default:
			return false
		}
	}
	if testutil.WaitReady(d.cc, 30*time.Second, exited) {
		return nil
	}
	if d.cmd.ProcessState != nil {
		return fmt.Errorf("exited (%w): %s", exit, strings.TrimSpace(d.logs.String()))
	}
	t.Fatalf("not ready in 30 s:\n%s", d.logs.String())
	return nil
}

func (d *driver) stop(t *testing.T) {
	t.Helper()
	d.cc.Close()
	if d.cmd.ProcessState != nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		t.Fatal("no exit 30 s after SIGTERM")
	}
}

// kill ends the driver as a crash does: SIGKILL, no clean stop.
func (d *driver) kill(t *testing.T) {
	t.Helper()
	d.cc.Close()
	d.cmd.Process.Kill()
	<-d.done
}

// downgradeGuard is the name in the state dir's tmp/ that the previous
// release's write probe renames onto (csi.downgradeGuard).
const downgradeGuard = ".write-probe"

func (d *driver) ctl() csipb.ControllerClient { return csipb.NewControllerClient(d.cc) }
func (d *driver) node() csipb.NodeClient      { return csipb.NewNodeClient(d.cc) }

var ctx = context.Background()

var (
	mountCap = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	blockCap = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
)

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// world is what the previous release made, and what must be served the
// same afterwards.
type world struct {
	dirVol, blkVol, grpVol string
	dirTarget, blkTarget   string // publications
	blkStaging             string
	dirSum, blkSum         string            // what was written through them
	snaps                  map[string]string // format -> snapshot id
	group                  string
	groupSnaps             []string
}

const blkData = 3 << 20

func makeWorld(t *testing.T, d *driver, dir string) *world {
	t.Helper()
	w := &world{snaps: map[string]string{}}
	create := func(name string, c *csipb.VolumeCapability, params map[string]string) string {
		r, err := d.ctl().CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csipb.VolumeCapability{c},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 32 << 20}, Parameters: params})
		if err != nil {
			t.Fatalf("previous release: CreateVolume %s: %v", name, err)
		}
		return r.GetVolume().GetVolumeId()
	}
	w.dirVol, w.blkVol, w.grpVol = create("dir", mountCap, nil), create("blk", blockCap, nil), create("grp", mountCap, nil)
	w.dirTarget = filepath.Join(dir, "pods", "dir")
	w.blkStaging, w.blkTarget = filepath.Join(dir, "staging", "blk"), filepath.Join(dir, "pods", "blk")
	os.MkdirAll(filepath.Dir(w.dirTarget), 0o755)
	os.MkdirAll(w.blkStaging, 0o755)
	if _, err := d.node().NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: w.dirVol, TargetPath: w.dirTarget, VolumeCapability: mountCap}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.node().NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: w.blkVol, StagingTargetPath: w.blkStaging, VolumeCapability: blockCap}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.node().NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: w.blkVol, StagingTargetPath: w.blkStaging, TargetPath: w.blkTarget, VolumeCapability: blockCap}); err != nil {
		t.Fatal(err)
	}
	// Data through the publications, as pods write it.
	data := bytes.Repeat([]byte("written by a pod under the previous release\n"), 20000)
	os.MkdirAll(filepath.Join(w.dirTarget, "sub"), 0o755)
	if err := os.WriteFile(filepath.Join(w.dirTarget, "sub", "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	w.dirSum = sum(data)
	bd := make([]byte, blkData)
	for i := range bd {
		bd[i] = byte(i * 31 / 7)
	}
	f, err := os.OpenFile(w.blkTarget, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bd, 0); err != nil {
		t.Fatal(err)
	}
	f.Sync()
	f.Close()
	w.blkSum = sum(bd)
	for format, params := range map[string]map[string]string{
		"tar.gz":  {"format": "tar.gz"},
		"tar.zst": {"compression": "zstd"},
		"reflink": {"format": "reflink"},
	} {
		r, err := testutil.SnapshotReady(ctx, testutil.Client(d.ctl()), &csipb.CreateSnapshotRequest{Name: "snap-" + format, SourceVolumeId: w.dirVol, Parameters: params})
		if err != nil {
			t.Fatalf("previous release: %s snapshot: %v", format, err)
		}
		w.snaps[format] = r.GetSnapshot().GetSnapshotId()
	}
	r, err := testutil.SnapshotReady(ctx, testutil.Client(d.ctl()), &csipb.CreateSnapshotRequest{Name: "snap-img", SourceVolumeId: w.blkVol})
	if err != nil {
		t.Fatalf("previous release: block snapshot: %v", err)
	}
	w.snaps["img"] = r.GetSnapshot().GetSnapshotId()
	g, err := csipb.NewGroupControllerClient(d.cc).CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "group", SourceVolumeIds: []string{w.dirVol, w.grpVol}})
	if err != nil {
		t.Fatalf("previous release: group snapshot: %v", err)
	}
	w.group = g.GetGroupSnapshot().GetGroupSnapshotId()
	for _, s := range g.GetGroupSnapshot().GetSnapshots() {
		w.groupSnaps = append(w.groupSnaps, s.GetSnapshotId())
	}
	return w
}

// check verifies, through d, that everything the world holds is served
// with the same bytes: listed, its publications readable, its snapshots
// restorable. Volumes it restores are deleted again.
func (w *world) check(t *testing.T, d *driver, who string) {
	t.Helper()
	vols, err := d.ctl().ListVolumes(ctx, &csipb.ListVolumesRequest{})
	if err != nil {
		t.Fatalf("%s: ListVolumes: %v", who, err)
	}
	listed := map[string]bool{}
	for _, e := range vols.GetEntries() {
		listed[e.GetVolume().GetVolumeId()] = true
	}
	for _, id := range []string{w.dirVol, w.blkVol, w.grpVol} {
		if !listed[id] {
			t.Fatalf("%s does not list volume %s", who, id)
		}
	}
	b, err := os.ReadFile(filepath.Join(w.dirTarget, "sub", "f"))
	if err != nil || sum(b) != w.dirSum {
		t.Fatalf("%s: the directory publication reads differently: %v", who, err)
	}
	if _, err := d.node().NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: w.dirVol, VolumePath: w.dirTarget}); err != nil {
		t.Fatalf("%s: stats of the publication: %v", who, err)
	}
	f, err := os.Open(w.blkTarget)
	if err != nil {
		t.Fatal(err)
	}
	bd := make([]byte, blkData)
	_, err = io.ReadFull(f, bd)
	f.Close()
	if err != nil || sum(bd) != w.blkSum {
		t.Fatalf("%s: the block publication reads differently: %v", who, err)
	}
	for format, id := range w.snaps {
		c := mountCap
		if format == "img" {
			c = blockCap
		}
		name := fmt.Sprintf("restore-%s-%s", strings.ReplaceAll(who, " ", "-"), strings.ReplaceAll(format, ".", "-"))
		r, err := d.ctl().CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csipb.VolumeCapability{c},
			CapacityRange:       &csipb.CapacityRange{RequiredBytes: 32 << 20},
			VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: id}}}})
		if err != nil {
			t.Fatalf("%s: restoring the %s snapshot: %v", who, format, err)
		}
		vid := r.GetVolume().GetVolumeId()
		target := filepath.Join(filepath.Dir(w.dirTarget), name)
		staging := ""
		if format == "img" {
			staging = filepath.Join(filepath.Dir(w.blkStaging), name)
			os.MkdirAll(staging, 0o755)
			if _, err := d.node().NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vid, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
				t.Fatalf("%s: staging the restore of %s: %v", who, format, err)
			}
		}
		if _, err := d.node().NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vid, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c}); err != nil {
			t.Fatalf("%s: publishing the restore of %s: %v", who, format, err)
		}
		var got string
		if format == "img" {
			f, err := os.Open(target)
			if err != nil {
				t.Fatal(err)
			}
			b := make([]byte, blkData)
			io.ReadFull(f, b)
			f.Close()
			got = sum(b)
		} else {
			b, _ := os.ReadFile(filepath.Join(target, "sub", "f"))
			got = sum(b)
		}
		if want := map[bool]string{true: w.blkSum, false: w.dirSum}[format == "img"]; got != want {
			t.Errorf("%s: the %s snapshot restores differently", who, format)
		}
		if _, err := d.node().NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vid, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if staging != "" {
			if _, err := d.node().NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vid, StagingTargetPath: staging}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := d.ctl().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: vid}); err != nil {
			t.Fatalf("%s: deleting the restore of %s: %v", who, format, err)
		}
	}
	g, err := csipb.NewGroupControllerClient(d.cc).GetVolumeGroupSnapshot(ctx, &csipb.GetVolumeGroupSnapshotRequest{GroupSnapshotId: w.group, SnapshotIds: w.groupSnaps})
	if err != nil || len(g.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Fatalf("%s: the group snapshot: %v", who, err)
	}
}

// cleanup unpublishes and deletes everything through d, also what a
// failed check left: every publication under dir is unmounted, every
// volume and snapshot the driver lists deleted (which detaches the loop
// devices of block volumes).
func (w *world) cleanup(t *testing.T, d *driver, dir string) {
	t.Helper()
	for _, sub := range []string{"pods", "staging"} {
		ents, _ := os.ReadDir(filepath.Join(dir, sub))
		for _, e := range ents {
			syscall.Unmount(filepath.Join(dir, sub, e.Name()), syscall.MNT_DETACH)
		}
	}
	csipb.NewGroupControllerClient(d.cc).DeleteVolumeGroupSnapshot(ctx, &csipb.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: w.group, SnapshotIds: w.groupSnaps})
	snaps, _ := d.ctl().ListSnapshots(ctx, &csipb.ListSnapshotsRequest{})
	for _, e := range snaps.GetEntries() {
		if _, err := d.ctl().DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: e.GetSnapshot().GetSnapshotId()}); err != nil {
			t.Errorf("deleting snapshot %s: %v", e.GetSnapshot().GetSnapshotId(), err)
		}
	}
	vols, _ := d.ctl().ListVolumes(ctx, &csipb.ListVolumesRequest{})
	for _, e := range vols.GetEntries() {
		if _, err := d.ctl().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: e.GetVolume().GetVolumeId()}); err != nil {
			t.Errorf("deleting volume %s: %v", e.GetVolume().GetVolumeId(), err)
		}
	}
}

func TestUpgradeFromPreviousRelease(t *testing.T) {
	testutil.RequireRoot(t)
	commit := previousCommit(t)
	previous, current := buildAt(t, commit), buildAt(t, "")
	// XFS (reflink=1, the mkfs default): every snapshot format exists.
	mnt := testfs.FileSystem(t, run, "xfs", 600<<20, nil, "")
	dir := t.TempDir()
	state, sock := filepath.Join(mnt, "state"), filepath.Join(dir, "csi.sock")

	prev := start(t, previous, state, sock)
	if err := prev.ready(t); err != nil {
		t.Fatalf("the previous release (%s) does not start: %v", commit[:12], err)
	}
	w := makeWorld(t, prev, dir)
	// Whatever fails below, nothing stays mounted or attached.
	t.Cleanup(func() {
		d := start(t, current, state, sock)
		if d.ready(t) == nil {
			w.cleanup(t, d, dir)
			// What a failure left beside the world (the image volume).
			if vols, err := d.ctl().ListVolumes(ctx, &csipb.ListVolumesRequest{}); err == nil {
				for _, e := range vols.GetEntries() {
					d.ctl().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: e.GetVolume().GetVolumeId()})
				}
			}
		}
		d.stop(t)
	})
	prev.stop(t)

	cur := start(t, current, state, sock)
	if err := cur.ready(t); err != nil {
		t.Fatalf("the current build does not start on the previous release's state: %v", err)
	}
	w.check(t, cur, "current")
	// The current one makes something of its own, then is killed: its
	// journal holds the volume's "creating" and, after a sync, its
	// "ready". The previous release, which reads a journal only up to
	// the first gap between synced batches, would apply the first alone
	// and delete the volume's data: it must refuse to start instead.
	made, err := cur.ctl().CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "made-by-current", VolumeCapabilities: []*csipb.VolumeCapability{mountCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	cur.kill(t)
	crashed := start(t, previous, state, sock)
	refusal := crashed.ready(t)
	if refusal == nil {
		crashed.stop(t)
		t.Fatal("the previous release started on the state of a current driver that did not stop cleanly")
	}
	if !strings.Contains(refusal.Error(), downgradeGuard) {
		t.Fatalf("the previous release after a crash of the current one: %v, want a refusal naming %s", refusal, downgradeGuard)
	}
	t.Logf("after a crash of the current build the previous release refuses: %v", refusal)
	cur = start(t, current, state, sock)
	if err := cur.ready(t); err != nil {
		t.Fatalf("the current build after its crash: %v", err)
	}
	if _, err := cur.ctl().ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: made.GetVolume().GetVolumeId()}); err != nil {
		t.Fatalf("the volume made before the crash: %v", err)
	}
	// An image volume, which the previous release does not know: while
	// one exists it refuses the state dir (it would take the volume for
	// a missing directory); the current build serves it across its
	// restart; once it is deleted the previous release may start again.
	img := imageVolume(t, cur, state, dir, "written before the restart")
	cur.stop(t)
	refused := start(t, previous, state, sock)
	if err := refused.ready(t); err == nil || !strings.Contains(err.Error(), downgradeGuard) {
		refused.stop(t)
		t.Fatalf("the previous release on a state dir holding an image volume: %v, want a refusal naming %s", err, downgradeGuard)
	} else {
		t.Logf("with an image volume the previous release refuses: %v", err)
	}
	cur = start(t, current, state, sock)
	if err := cur.ready(t); err != nil {
		t.Fatalf("the current build after the refused rollback: %v", err)
	}
	img.check(t, cur, "written before the restart")
	img.remove(t, cur)
	cur.stop(t)
	// The start after the last image volume went records the older format.
	cur = start(t, current, state, sock)
	if err := cur.ready(t); err != nil {
		t.Fatal(err)
	}
	cur.stop(t)

	// Rollback: the previous release on the state the current one wrote
	// serves it or refuses with one line; then the current one serves
	// everything as before.
	back := start(t, previous, state, sock)
	if err := back.ready(t); err != nil {
		msg := strings.TrimSpace(back.logs.String())
		if strings.Count(msg, "\n") != 0 {
			t.Fatalf("the previous release refused the current state with more than one line:\n%s", msg)
		}
		t.Logf("the previous release refuses the current state: %s", msg)
	} else {
		w.check(t, back, "previous after rollback")
		t.Log("the previous release serves the state the current one wrote")
		back.stop(t)
	}
	again := start(t, current, state, sock)
	if err := again.ready(t); err != nil {
		t.Fatalf("the current build after the rollback attempt: %v", err)
	}
	w.check(t, again, "current after rollback")
	again.stop(t)
}
