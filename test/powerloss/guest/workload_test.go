package guest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

var (
	mountCap = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	blockCap = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
)

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// workload runs the real driver on state, with pool fast on its own file
// system at pool, and drives it through the CSI API: creates (empty, from
// snapshot, from volume; directory and block; in both pools), snapshots
// (tar.gz, zstd, block), publish and unpublish, block data written
// through a published device, expansion, modify and deletes, a burst of
// concurrent creates and deletes (commits sharing syncs), a crash of the
// driver and its start again, with a writer appending and fsyncing to a
// file in a volume meanwhile; image volumes (ext4 in both pools, XFS), one
// grown online and one grown while not staged (growOffline), a group
// snapshot of them, and a crash of the driver while a snapshot holds one
// frozen; and a standby copy pulled into the data disk
// (standbyGenerations). The journal is small, so the run crosses
// many checkpoints and epochs.
func workload(t *testing.T, rec *recorder, state, pool string) {
	const logs = "/tmp/powerloss-driver.log"
	d := startDriver(t, state, pool, logs)
	targets := filepath.Join(filepath.Dir(state), "..", filepath.Base(filepath.Dir(state))+"-targets")
	defer func() {
		d.stop(unix.SIGTERM)
		// The last round's volume stays published, as with a pod running
		// at the power loss: its mount goes here, not through the driver.
		ents, _ := os.ReadDir(targets)
		for _, e := range ents {
			unix.Unmount(filepath.Join(targets, e.Name()), unix.MNT_DETACH)
		}
		detachBlock(state)
		detachBlock(pool)
		if t.Failed() {
			b, _ := os.ReadFile(logs)
			t.Logf("driver log:\n%s", b)
		}
	}()
	ctx := context.Background()
	ctl := func() csipb.ControllerClient { return csipb.NewControllerClient(d.cc) }
	node := func() csipb.NodeClient { return csipb.NewNodeClient(d.cc) }
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	rec.ack(t, plan.Op{Kind: "epoch", Epoch: Epoch(state)})
	createIn := func(layout, name string, c *csipb.VolumeCapability, size int64, src *csipb.VolumeContentSource, source, pl string, expect []byte) string {
		req := &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csipb.VolumeCapability{c},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: size}, VolumeContentSource: src, Parameters: map[string]string{}}
		if pl != "" {
			req.Parameters["pool"] = pl
		}
		if layout != "" {
			req.Parameters["layout"] = layout
		}
		r, err := ctl().CreateVolume(ctx, req)
		must("CreateVolume "+name, err)
		op := plan.Op{Kind: "create", ID: r.GetVolume().GetVolumeId(), Access: "mount", Layout: layout, Source: source, Size: r.GetVolume().GetCapacityBytes(), Pool: pl}
		if c == blockCap {
			op.Access = "block"
		}
		if expect != nil {
			op.Offset, op.Length, op.Sum = plan.BlockOffset, int64(len(expect)), sum(expect)
		}
		rec.ack(t, op)
		return op.ID
	}
	create := func(name string, c *csipb.VolumeCapability, size int64, src *csipb.VolumeContentSource, source, pl string, expect []byte) string {
		return createIn("", name, c, size, src, source, pl, expect)
	}
	snapshot := func(name, vol string, params map[string]string, format, pl string) string {
		r, err := testutil.SnapshotReady(ctx, testutil.Client(ctl()), &csipb.CreateSnapshotRequest{Name: name, SourceVolumeId: vol, Parameters: params})
		must("CreateSnapshot "+name, err)
		rec.ack(t, plan.Op{Kind: "snapshot", ID: r.GetSnapshot().GetSnapshotId(), Source: vol, Format: format, Pool: pl})
		return r.GetSnapshot().GetSnapshotId()
	}
	fromSnap := func(id string) *csipb.VolumeContentSource {
		return &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	}
	fromVol := func(id string) *csipb.VolumeContentSource {
		return &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}
	dataDir := func(pl string) string {
		if pl != "" {
			return pool
		}
		return state
	}

	// The writer's volume, then the writer: a record appended and
	// fdatasynced every 100 ms until the workload ends. It writes
	// through its own descriptor: a restart of the driver does not stop
	// it, as a pod's writes go on while its node's driver restarts.
	wvol := create("writer", mountCap, 16<<20, nil, "", "", nil)
	file := fmt.Sprintf(WriterFile, wvol)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		appendRecords(t, rec, "writer", filepath.Join(state, file), stop, func(n int64) plan.Op {
			return plan.Op{Kind: "write", ID: wvol, File: file, Bytes: n}
		})
	}()

	// An image volume, staged and published as for a pod, and a writer
	// appending and fdatasyncing records to a file on its own file
	// system (through its loop device, with direct I/O) meanwhile.
	ivol := createIn("image", "image", mountCap, 32<<20, nil, "", "", nil)
	istaging, itarget := filepath.Join(targets, "image-staging"), filepath.Join(targets, "image-target")
	os.MkdirAll(istaging, 0o755)
	_, err := node().NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: ivol, StagingTargetPath: istaging, VolumeCapability: mountCap})
	must("NodeStageVolume (image)", err)
	_, err = node().NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: ivol, StagingTargetPath: istaging, TargetPath: itarget, VolumeCapability: mountCap})
	must("NodePublishVolume (image)", err)
	rec.ack(t, plan.Op{Kind: "publish", ID: ivol, Target: itarget})
	wg.Add(1)
	go func() {
		defer wg.Done()
		appendRecords(t, rec, "image writer", filepath.Join(itarget, plan.ImageWriterFile), stop, func(n int64) plan.Op {
			return plan.Op{Kind: "image-write", ID: ivol, File: plan.ImageWriterFile, Bytes: n}
		})
	}()

	for round := 0; round < 3; round++ {
		p := fmt.Sprintf("r%d-", round)
		// Round 1 keeps its directory volume, its snapshots and their
		// restores in the pool.
		pl := ""
		if round == 1 {
			pl = plan.PoolName
		}
		dir := create(p+"dir", mountCap, 8<<20, nil, "", pl, nil)
		// Data in the directory volume, as a pod writes it, made durable
		// before the snapshot (a snapshot archives what is there).
		must("data", os.WriteFile(filepath.Join(dataDir(pl), "volumes", dir, "data"), []byte(strings.Repeat(p+"data ", 20000)), 0o644))
		blk := create(p+"blk", blockCap, 8<<20, nil, "", "", nil)
		written := writeBlock(t, rec, node(), blk, round, targets)
		gz := snapshot(p+"gz", dir, map[string]string{"format": "tar.gz"}, "tar.gz", pl)
		zst := snapshot(p+"zst", dir, map[string]string{"compression": "zstd"}, "tar.zst", pl)
		img := snapshot(p+"img", blk, nil, "img", "")
		// The image volume's snapshot, cut frozen while its writer
		// writes, and a restore of it.
		isnap := snapshot(p+"image-snap", ivol, nil, "img", "")
		createIn("image", p+"from-image", mountCap, 32<<20, fromSnap(isnap), isnap, "", nil)
		create(p+"from-gz", mountCap, 8<<20, fromSnap(gz), gz, pl, nil)
		create(p+"from-zst", mountCap, 8<<20, fromSnap(zst), zst, "", nil)
		clone := create(p+"clone", mountCap, 8<<20, fromVol(dir), dir, pl, nil)
		create(p+"from-img", blockCap, 16<<20, fromSnap(img), img, "", written)
		create(p+"blk-clone", blockCap, 16<<20, fromVol(blk), blk, "", written)

		target := filepath.Join(targets, p+"target")
		os.MkdirAll(target, 0o755)
		_, err := node().NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: dir, TargetPath: target, VolumeCapability: mountCap})
		must("NodePublishVolume", err)
		rec.ack(t, plan.Op{Kind: "publish", ID: dir, Target: target})
		_, err = ctl().ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: dir, CapacityRange: &csipb.CapacityRange{RequiredBytes: 12 << 20}})
		must("ControllerExpandVolume", err)
		rec.ack(t, plan.Op{Kind: "expand", ID: dir, Size: 12 << 20})
		_, err = ctl().ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: dir, MutableParameters: map[string]string{"snapshotFormat": "tar.gz"}})
		must("ControllerModifyVolume", err)
		rec.ack(t, plan.Op{Kind: "modify", ID: dir})
		if round != 2 { // the last round's stays published
			rec.ack(t, plan.Op{Kind: "issue-unpublish", ID: dir, Target: target})
			_, err = node().NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: dir, TargetPath: target})
			must("NodeUnpublishVolume", err)
			rec.ack(t, plan.Op{Kind: "unpublish", ID: dir, Target: target})
		}

		// A delete in flight at a power loss may finish at start or not:
		// the host allows either once it was issued.
		rec.ack(t, plan.Op{Kind: "issue-delete", ID: clone})
		_, err = ctl().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: clone})
		must("DeleteVolume", err)
		rec.ack(t, plan.Op{Kind: "delete", ID: clone})
		rec.ack(t, plan.Op{Kind: "issue-delete-snapshot", ID: zst})
		_, err = ctl().DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: zst})
		must("DeleteSnapshot", err)
		rec.ack(t, plan.Op{Kind: "delete-snapshot", ID: zst})

		if round == 1 {
			// A crash of the driver (SIGKILL) and its start: the start
			// redoes the journal and checkpoints while the writer goes
			// on.
			d.stop(unix.SIGKILL)
			d = startDriver(t, state, pool, logs)
			rec.ack(t, plan.Op{Kind: "restart", Epoch: Epoch(state)})
		}
	}

	// A standby copy of another node's volume kept here, its
	// generations pulled while the writers write.
	standbyGenerations(t, rec, filepath.Join(filepath.Dir(state), plan.StandbyState))

	// Image volumes beyond the first: an XFS one and one in the pool,
	// each published with a file written; the first grown online while
	// its writer writes; a group snapshot of all three, frozen together;
	// and the driver killed while a snapshot holds the first frozen (the
	// start thaws it, and its writer goes on).
	xfsCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "xfs"}},
		AccessMode: mountCap.GetAccessMode()}
	xr, err := ctl().CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "xfs-image", VolumeCapabilities: []*csipb.VolumeCapability{xfsCap},
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 300 << 20}, Parameters: map[string]string{"layout": "image"}})
	must("CreateVolume xfs-image", err)
	xvol := xr.GetVolume().GetVolumeId()
	rec.ack(t, plan.Op{Kind: "create", ID: xvol, Access: "mount", Layout: "image", FSType: "xfs", Size: xr.GetVolume().GetCapacityBytes()})
	pvol := createIn("image", "pool-image", mountCap, 32<<20, nil, "", plan.PoolName, nil)
	for _, v := range []struct {
		id  string
		cap *csipb.VolumeCapability
	}{{xvol, xfsCap}, {pvol, mountCap}} {
		staging, target := filepath.Join(targets, v.id+"-staging"), filepath.Join(targets, v.id+"-target")
		os.MkdirAll(staging, 0o755)
		_, err := node().NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: staging, VolumeCapability: v.cap})
		must("NodeStageVolume "+v.id, err)
		_, err = node().NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: v.cap})
		must("NodePublishVolume "+v.id, err)
		rec.ack(t, plan.Op{Kind: "publish", ID: v.id, Target: target})
		f, err := os.Create(filepath.Join(target, "data"))
		must("data", err)
		_, err = f.Write([]byte(strings.Repeat("image data ", 50000)))
		must("data", err)
		must("data", f.Sync())
		f.Close()
	}
	growOffline(t, rec, ctl(), node(), createIn("image", "grown-image", mountCap, 32<<20, nil, "", "", nil), targets)
	_, err = ctl().ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: ivol, CapacityRange: &csipb.CapacityRange{RequiredBytes: 48 << 20}, VolumeCapability: mountCap})
	must("ControllerExpandVolume (image)", err)
	_, err = node().NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: ivol, VolumePath: itarget, CapacityRange: &csipb.CapacityRange{RequiredBytes: 48 << 20}})
	must("NodeExpandVolume (image)", err)
	rec.ack(t, plan.Op{Kind: "expand", ID: ivol, Size: 48 << 20})
	g, err := csipb.NewGroupControllerClient(d.cc).CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "image-group", SourceVolumeIds: []string{ivol, xvol, pvol}})
	must("CreateVolumeGroupSnapshot", err)
	for _, s := range g.GetGroupSnapshot().GetSnapshots() {
		pl := ""
		if s.GetSourceVolumeId() == pvol {
			pl = plan.PoolName
		}
		rec.ack(t, plan.Op{Kind: "snapshot", ID: s.GetSnapshotId(), Source: s.GetSourceVolumeId(), Format: "img", Pool: pl})
	}
	killed := make(chan error, 1)
	go func() {
		_, err := ctl().CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "killed-frozen", SourceVolumeId: ivol})
		killed <- err
	}()
	freezeRecords := filepath.Join(state, "freezes", ivol+".*.json") // by volume and freeze
	inside := false
	for deadline := time.Now().Add(30 * time.Second); !inside && len(killed) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Microsecond) {
		m, _ := filepath.Glob(freezeRecords)
		inside = len(m) > 0
	}
	d.stop(unix.SIGKILL)
	<-killed
	fmt.Printf("powerloss workload: the driver killed with the image volume's freeze recorded: %v\n", inside)
	d = startDriver(t, state, pool, logs)
	rec.ack(t, plan.Op{Kind: "restart", Epoch: Epoch(state)})

	// A burst of concurrent creates and deletes: their commits share
	// syncs, and appends land on the unit after a sync.
	var burst sync.WaitGroup
	for w := range 6 {
		burst.Add(1)
		go func() {
			defer burst.Done()
			var made []string
			for i := range 3 {
				pl := ""
				if w%2 == 1 {
					pl = plan.PoolName
				}
				made = append(made, create(fmt.Sprintf("burst-%d-%d", w, i), mountCap, 1<<20, nil, "", pl, nil))
			}
			rec.ack(t, plan.Op{Kind: "issue-delete", ID: made[0]})
			_, err := ctl().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: made[0]})
			if err != nil {
				t.Errorf("DeleteVolume %s: %v", made[0], err)
				return
			}
			rec.ack(t, plan.Op{Kind: "delete", ID: made[0]})
		}()
	}
	burst.Wait()
	rec.ack(t, plan.Op{Kind: "epoch", Epoch: Epoch(state)})
	close(stop)
	wg.Wait()
}

// growOffline grows ext4 image volume id (32 MiB: one short group) while
// nothing has it staged, as a pod's volume is grown between two of its
// runs: a file written on it, the expand (its image grows), then its next
// stage, which grows its file system in-process (format/ext4: the short
// group widened, a group with a superblock copy added), and a file of 12 MB
// written on the grown file system. Each file is acknowledged (image-file) once fsynced; a
// power loss inside the growth leaves what the stage after finishes.
func growOffline(t *testing.T, rec *recorder, ctl csipb.ControllerClient, node csipb.NodeClient, id, targets string) {
	ctx := context.Background()
	staging, target := filepath.Join(targets, "grown-staging"), filepath.Join(targets, "grown-target")
	os.MkdirAll(staging, 0o755)
	use := func(file string, data []byte) {
		if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mountCap}); err != nil {
			t.Fatalf("NodeStageVolume (grown image): %v", err)
		}
		if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap}); err != nil {
			t.Fatalf("NodePublishVolume (grown image): %v", err)
		}
		f, err := os.Create(filepath.Join(target, file))
		if err == nil {
			_, err = f.Write(data)
		}
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			t.Fatalf("writing %s on the grown image: %v", file, err)
		}
		f.Close()
		rec.ack(t, plan.Op{Kind: "image-file", ID: id, File: file, Sum: sum(data)})
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatalf("NodeUnpublishVolume (grown image): %v", err)
		}
		if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume (grown image): %v", err)
		}
	}
	use("before", []byte(strings.Repeat("before the growth ", 60000)))
	if _, err := ctl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: plan.GrownSize}, VolumeCapability: mountCap}); err != nil {
		t.Fatalf("ControllerExpandVolume (grown image): %v", err)
	}
	rec.ack(t, plan.Op{Kind: "expand", ID: id, Size: plan.GrownSize})
	use("after", []byte(strings.Repeat("after the growth ", 700000)))
}

// writeBlock stages and publishes block volume id, writes round's data
// through the device, fsyncs it, acknowledges it (write-block), and
// unpublishes and unstages the volume. It returns what it wrote.
func writeBlock(t *testing.T, rec *recorder, node csipb.NodeClient, id string, round int, targets string) []byte {
	ctx := context.Background()
	staging, target := filepath.Join(targets, fmt.Sprintf("r%d-blk-staging", round)), filepath.Join(targets, fmt.Sprintf("r%d-blk-target", round))
	os.MkdirAll(staging, 0o755)
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: blockCap}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: blockCap}); err != nil {
		t.Fatalf("NodePublishVolume (block): %v", err)
	}
	data := plan.BlockData(round)
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, plan.BlockOffset); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rec.ack(t, plan.Op{Kind: "write-block", ID: id, Offset: plan.BlockOffset, Length: int64(len(data)), Sum: sum(data)})
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume (block): %v", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume (block): %v", err)
	}
	return data
}

// appendRecords appends a record to path and fdatasyncs it every 100 ms
// until stop, acknowledging op(bytes synced so far) after each: the
// writes a pod makes meanwhile, through a descriptor of its own.
func appendRecords(t *testing.T, rec *recorder, who, path string, stop <-chan struct{}, op func(n int64) plan.Op) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("%s: %v", who, err)
		return
	}
	defer f.Close()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := f.Write(plan.Record(i)); err != nil {
			t.Errorf("%s: %v", who, err)
			return
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			t.Errorf("%s: fdatasync: %v", who, err)
			return
		}
		rec.ack(t, op(int64(i+1)*plan.RecordSize))
	}
}
