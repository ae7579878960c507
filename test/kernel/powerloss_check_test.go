package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

// mounted is a file system of a point's image, mounted after the
// recovery a boot would make and a clean fsck.
type mounted struct {
	dev loop.Device
	mnt string
}

// mountChecked attaches img, mounts it once (the file system's journal or
// log replays, as at a boot after the power loss), has fsck check what
// recovery left, and mounts it again.
func mountChecked(t *testing.T, fs fsSpec, img string, bad func(string, ...any)) *mounted {
	dev, err := loop.Attach(img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := &mounted{dev: dev}
	if m.mnt, err = os.MkdirTemp("", "powerloss-mnt-"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dev.Path(), m.mnt, fs.name, 0, ""); err != nil {
		bad("mount %s after the power loss: %v", fs.name, err)
		m.release()
		return nil
	}
	syscall.Unmount(m.mnt, 0)
	if out, err := exec.Command(fs.fsck[0], append(fs.fsck[1:], dev.Path())...).CombinedOutput(); err != nil {
		bad("%s: %v: %s", fs.fsck[0], err, lastLines(string(out), 3))
	}
	if err := syscall.Mount(dev.Path(), m.mnt, fs.name, 0, ""); err != nil {
		bad("mount %s: %v", fs.name, err)
		m.release()
		return nil
	}
	return m
}

func (m *mounted) release() {
	syscall.Unmount(m.mnt, syscall.MNT_DETACH)
	os.Remove(m.mnt)
	loop.Detach(m.dev)
}

// checkPoint mounts the image of one point and its pool, has fsck check
// both, starts the driver on them and checks what a power loss there must
// have kept (acked) and must not show. It returns what is wrong:
//   - the driver is ready within 10 s, reports no damaged record, no
//     unowned data, no pool down;
//   - every acknowledged volume and snapshot is listed (ready), with its
//     size, and nothing an acknowledged delete removed is, or its data;
//   - every listed volume and snapshot has its data, in its pool;
//   - restores and clones hold their source's data: a directory's file
//     pattern, a block volume's bytes written through its device;
//   - every block write acknowledged is in its volume's image;
//   - every archive snapshot's file has its recorded sha256, and one is
//     restored now and holds its volume's data;
//   - publish, unpublish and modify acknowledged are in the records;
//   - every byte the writer fsynced is there;
//   - the image volume grown while not staged stages (which finishes a
//     growth cut), holds every file fsynced on it, and has grown if its
//     expand was acknowledged;
//   - every image volume's file system is clean once its journal is
//     replayed (on a copy), and holds every byte the image writer
//     fsynced on it; every snapshot of an image volume is clean as it
//     is (it was cut frozen).
func checkPoint(t *testing.T, fs fsSpec, driver, img string, acked []plan.Op) (problems []string) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	m := mountChecked(t, fs, img, bad)
	if m == nil {
		return
	}
	defer m.release()
	state := filepath.Join(m.mnt, "state")
	if _, err := os.Stat(state); os.IsNotExist(err) && len(acked) == 0 {
		return // before the driver made anything
	}
	p := mountChecked(t, poolFS, filepath.Join(m.mnt, plan.PoolImage), bad)
	if p == nil {
		return
	}
	defer p.release()
	dirOf := func(pool string) string {
		if pool != "" {
			return p.mnt
		}
		return state
	}

	sock := filepath.Join(os.TempDir(), fmt.Sprintf("powerloss-%d.sock", os.Getpid()))
	os.Remove(sock)
	cmd := exec.Command(driver, plan.DriverArgs(sock, state, p.mnt)...)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		// Block volumes the driver attached at start: their loop devices
		// go before the images are unmounted.
		detachUnder(state)
		detachUnder(p.mnt)
	}()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	if !testutil.WaitReady(cc, 10*time.Second, nil) {
		bad("the driver is not ready within 10 s: %s", lastLines(logs.String(), 3))
		return
	}
	ctl, node := csipb.NewControllerClient(cc), csipb.NewNodeClient(cc)
	health, err := node.NodeGetStorageHealth(ctx, &csipb.NodeGetStorageHealthRequest{})
	if err != nil {
		bad("NodeGetStorageHealth: %v", err)
	}
	for _, h := range health.GetBackendHealth() {
		switch h.GetReason() {
		case "StateRecordsDamaged", "UnownedData", "PoolDown", "StateJournalFailed":
			bad("health after the power loss: %s: %s", h.GetReason(), h.GetMessage())
		}
	}
	vols, err := ctl.ListVolumes(ctx, &csipb.ListVolumesRequest{})
	if err != nil {
		bad("ListVolumes: %v", err)
		return
	}
	snaps, err := ctl.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{})
	if err != nil {
		bad("ListSnapshots: %v", err)
		return
	}
	listed := map[string]*csipb.Volume{}
	for _, e := range vols.GetEntries() {
		listed[e.GetVolume().GetVolumeId()] = e.GetVolume()
	}
	snapListed := map[string]bool{}
	for _, e := range snaps.GetEntries() {
		snapListed[e.GetSnapshot().GetSnapshotId()] = e.GetSnapshot().GetReadyToUse()
	}

	// What must be there: acknowledged creates and snapshots not deleted
	// by a delete issued; what must not: what an acknowledged delete
	// removed.
	wantVol, wantSnap, deleted, snapDeleted := map[string]plan.Op{}, map[string]plan.Op{}, map[string]bool{}, map[string]bool{}
	var written int64
	var writerFile string
	sizes := map[string]int64{}
	pools := map[string]string{} // volume or snapshot id -> pool
	type pubKey struct{ vol, target string }
	published := map[pubKey]string{} // the last of publish, issue-unpublish, unpublish
	modified := map[string]bool{}
	blockWrites := map[string]plan.Op{}
	images := map[string]bool{}    // image volumes, by id
	imageFS := map[string]string{} // their file systems (ext4 when empty)
	var imageWritten int64
	var imageWriter string
	imageFiles := map[string][]plan.Op{} // files fsynced on an image volume grown while not staged
	for _, op := range acked {
		switch op.Kind {
		case "create":
			wantVol[op.ID], sizes[op.ID], pools[op.ID] = op, op.Size, op.Pool
			images[op.ID] = op.Layout == "image"
			imageFS[op.ID] = op.FSType
		case "image-write":
			imageWritten, imageWriter = max(imageWritten, op.Bytes), op.ID
		case "image-file":
			imageFiles[op.ID] = append(imageFiles[op.ID], op)
		case "expand":
			sizes[op.ID] = op.Size
		case "issue-delete":
			delete(wantVol, op.ID)
		case "delete":
			delete(wantVol, op.ID)
			deleted[op.ID] = true
		case "snapshot":
			wantSnap[op.ID], pools[op.ID] = op, op.Pool
		case "issue-delete-snapshot":
			delete(wantSnap, op.ID)
		case "delete-snapshot":
			delete(wantSnap, op.ID)
			snapDeleted[op.ID] = true
		case "publish", "issue-unpublish", "unpublish":
			published[pubKey{op.ID, op.Target}] = op.Kind
		case "modify":
			modified[op.ID] = true
		case "write-block":
			blockWrites[op.ID] = op
		case "write":
			written, writerFile = max(written, op.Bytes), op.File
		}
	}
	for id := range wantVol {
		v, ok := listed[id]
		if !ok {
			bad("acknowledged volume %s is not listed", id)
			continue
		}
		if v.GetCapacityBytes() < sizes[id] {
			bad("volume %s has %d bytes, acknowledged %d", id, v.GetCapacityBytes(), sizes[id])
		}
	}
	for id := range wantSnap {
		if ready, ok := snapListed[id]; !ok || !ready {
			bad("acknowledged snapshot %s is not listed ready", id)
		}
	}
	for id := range deleted {
		if _, ok := listed[id]; ok {
			bad("volume %s, whose delete was acknowledged, is listed", id)
		}
		if m := dataUnder(id, state, p.mnt); len(m) > 0 {
			bad("volume %s, whose delete was acknowledged, still has data: %v", id, m)
		}
	}
	for id := range snapDeleted {
		if _, ok := snapListed[id]; ok {
			bad("snapshot %s, whose delete was acknowledged, is listed", id)
		}
	}
	// Nothing half-made is listed: every listed volume and snapshot has
	// its data.
	for id := range listed {
		if len(dataUnder(id, state, p.mnt)) == 0 {
			bad("listed volume %s has no data", id)
		}
	}
	for id := range snapListed {
		if len(dataUnder(id, state, p.mnt)) == 0 {
			bad("listed snapshot %s has no data", id)
		}
	}
	// Restores and clones hold their source's data: the file each round
	// wrote before its snapshots (20000 times "rN-data "), or the bytes
	// its block volume was written through its device.
	for _, op := range wantVol {
		switch {
		case op.Layout == "image":
			// Checked with the other image volumes, below.
		case op.Source != "" && op.Access == "mount":
			b, err := os.ReadFile(filepath.Join(dirOf(op.Pool), "volumes", op.ID, "data"))
			if err != nil || !isRoundData(b) {
				bad("acknowledged %s from %s does not hold its source's data (%d bytes, %v)", op.ID, op.Source, len(b), err)
			}
		case op.Sum != "":
			if got := rangeSum(filepath.Join(dirOf(op.Pool), "volumes", op.ID+".img"), op.Offset, op.Length); got != op.Sum {
				bad("acknowledged block %s from %s does not hold its source's bytes", op.ID, op.Source)
			}
		}
	}
	for id, op := range blockWrites {
		if _, ok := wantVol[id]; !ok {
			continue
		}
		if got := rangeSum(filepath.Join(dirOf(pools[id]), "volumes", id+".img"), op.Offset, op.Length); got != op.Sum {
			bad("block volume %s lacks the bytes written and fsynced through its device", id)
		}
	}
	// Archive snapshots have the sha256 their record says, and one is
	// restored now.
	var restore *plan.Op
	for id, op := range wantSnap {
		if op.Format != "tar.gz" && op.Format != "tar.zst" {
			continue
		}
		var rec struct {
			SHA256 string `json:"sha256"`
		}
		b, err := os.ReadFile(filepath.Join(state, "meta", "snapshots", id+".json"))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.SHA256 == "" {
			bad("snapshot %s: its record gives no sha256 (%v)", id, err)
			continue
		}
		if got := fileSum(filepath.Join(dirOf(op.Pool), "snapshots", id+"."+op.Format)); got != rec.SHA256 {
			bad("snapshot %s: its archive has sha256 %.12s, its record %.12s", id, got, rec.SHA256)
		}
	}
	for _, op := range acked { // the last one acknowledged
		if _, ok := wantSnap[op.ID]; ok && op.Kind == "snapshot" && (op.Format == "tar.gz" || op.Format == "tar.zst") {
			restore = &op
		}
	}
	if restore != nil {
		req := &csipb.CreateVolumeRequest{Name: "powerloss-check-restore",
			VolumeCapabilities:  []*csipb.VolumeCapability{{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}, AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
			CapacityRange:       &csipb.CapacityRange{RequiredBytes: 16 << 20},
			VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: restore.ID}}}}
		if restore.Pool != "" {
			req.Parameters = map[string]string{"pool": restore.Pool}
		}
		r, err := ctl.CreateVolume(ctx, req)
		if err != nil {
			bad("restoring snapshot %s after the power loss: %v", restore.ID, err)
		} else {
			b, err := os.ReadFile(filepath.Join(dirOf(restore.Pool), "volumes", r.GetVolume().GetVolumeId(), "data"))
			if err != nil || !isRoundData(b) {
				bad("the restore of snapshot %s after the power loss lacks its data (%v)", restore.ID, err)
			}
			if _, err := ctl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: r.GetVolume().GetVolumeId()}); err != nil {
				bad("deleting the restore: %v", err)
			}
		}
	}
	// Publish, unpublish and modify, in the records.
	for k, kind := range published {
		if _, ok := wantVol[k.vol]; !ok || kind == "issue-unpublish" {
			continue
		}
		var rec struct {
			Published []struct {
				Target string `json:"target"`
			} `json:"published"`
		}
		b, _ := os.ReadFile(filepath.Join(state, "meta", "volumes", k.vol+".json"))
		json.Unmarshal(b, &rec)
		has := slices.ContainsFunc(rec.Published, func(p struct {
			Target string `json:"target"`
		}) bool {
			return p.Target == k.target
		})
		if kind == "publish" && !has {
			bad("volume %s: its acknowledged publish at %s is not in its record", k.vol, k.target)
		}
		if kind == "unpublish" && has {
			bad("volume %s: its acknowledged unpublish of %s is not in its record", k.vol, k.target)
		}
	}
	for id := range modified {
		if _, ok := wantVol[id]; !ok {
			continue
		}
		var rec struct {
			Mutable map[string]string `json:"mutable"`
		}
		b, _ := os.ReadFile(filepath.Join(state, "meta", "volumes", id+".json"))
		json.Unmarshal(b, &rec)
		if rec.Mutable["snapshotFormat"] != "tar.gz" {
			bad("volume %s: its acknowledged modify is not in its record", id)
		}
	}
	// An image volume grown while not staged is staged first, as its pod's
	// next start would: that finishes a growth the power loss cut.
	for id, op := range wantVol {
		if op.Layout == "image" && op.FSType == "" && (len(imageFiles[id]) > 0 || sizes[id] == plan.GrownSize) {
			for _, p := range stageGrown(ctx, node, id, imageFiles[id], sizes[id]) {
				bad("image volume %s, grown while not staged: %s", id, p)
			}
		}
	}
	// Image volumes: their own file systems, and the image writer's bytes.
	for id, op := range wantVol {
		if op.Layout != "image" {
			continue
		}
		want := int64(0)
		if id == imageWriter {
			want = imageWritten
		}
		for _, p := range checkImage(filepath.Join(dirOf(op.Pool), "volumes", id+".img"), want, op.FSType) {
			bad("image volume %s: %s", id, p)
		}
	}
	for id, op := range wantSnap {
		if !images[op.Source] {
			continue
		}
		snap := filepath.Join(dirOf(op.Pool), "snapshots", id+".img")
		if imageFS[op.Source] == "xfs" {
			// XFS's freeze leaves its log to replay (a mount does, as a
			// restore's first stage does), then it is clean.
			for _, p := range checkImage(snap, 0, "xfs") {
				bad("snapshot %s of XFS image volume %s: %s", id, op.Source, p)
			}
			continue
		}
		if out, err := exec.Command("e2fsck", "-fn", snap).CombinedOutput(); err != nil {
			bad("snapshot %s of image volume %s is not a clean file system as it is: %v: %s", id, op.Source, err, lastLines(string(out), 3))
		}
	}
	for _, p := range checkStandby(m.mnt, acked) {
		bad("%s", p)
	}
	// Every fsynced byte of the writer is there.
	if written > 0 {
		b, err := os.ReadFile(filepath.Join(state, writerFile))
		if err != nil || int64(len(b)) < written {
			bad("the writer fsynced %d bytes, %d are there (%v)", written, len(b), err)
		} else {
			for n := 0; int64(n+1)*plan.RecordSize <= written; n++ {
				if string(b[n*plan.RecordSize:(n+1)*plan.RecordSize]) != string(plan.Record(n)) {
					bad("the writer's record %d (fsynced) differs", n)
					break
				}
			}
		}
	}
	return problems
}

// isRoundData says whether b is a round's data file: 20000 times "rN-data ".
func isRoundData(b []byte) bool {
	return len(b) >= 8 && b[0] == 'r' && string(b) == strings.Repeat(string(b[:8]), 20000)
}

// dataUnder lists what the volumes and snapshots directories of the
// pools at dirs hold under id.
func dataUnder(id string, dirs ...string) []string {
	var out []string
	for _, d := range dirs {
		for _, sub := range []string{"volumes", "snapshots"} {
			m, _ := filepath.Glob(filepath.Join(d, sub, id+"*"))
			out = append(out, m...)
		}
	}
	return out
}

func fileSum(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}

func rangeSum(path string, off, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, io.NewSectionReader(f, off, n))
	return hex.EncodeToString(h.Sum(nil))
}

// detachUnder detaches the loop devices of the block volumes under a
// pool's directory (the driver attaches them at start and leaves them
// attached when it stops, as across a restart on a node).
func detachUnder(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "volumes", "*.img"))
	for _, f := range files {
		devs, _ := loop.FindAll(f)
		for _, d := range devs {
			loop.Detach(d)
		}
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}
