// Package guest records the power-loss workload in a kernel-matrix guest
// (make test-powerloss): the state dir on a file system over a
// dm-log-writes target, the real driver binary serving a workload through
// the CSI API, and a mark in the log after every acknowledged operation
// and every fsynced write, each also printed on the console for the host,
// which replays the log (test/kernel's TestPowerLoss).
package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hostpath-csi/hostpath/internal/dm"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

// Environment the host sets for a recording.
const (
	EnvFS      = "POWERLOSS_FS"       // ext4 or xfs: the data disk's file system, made by the host
	EnvData    = "POWERLOSS_DATA"     // serial of the data disk
	EnvLog     = "POWERLOSS_LOG"      // serial of the log disk
	WriterFile = "volumes/%s/journal" // the writer's file in its volume
)

func diskBySerial(serial string) (string, error) {
	ents, _ := filepath.Glob("/sys/block/vd*/serial")
	for _, e := range ents {
		if b, err := os.ReadFile(e); err == nil && strings.TrimSpace(string(b)) == serial {
			return "/dev/" + filepath.Base(filepath.Dir(e)), nil
		}
	}
	return "", fmt.Errorf("no disk with serial %q", serial)
}

func sectors(dev string) (uint64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
	return n / 512, err
}

// recorder puts marks in the log and the ops on the console, in order.
type recorder struct {
	mu  sync.Mutex
	dev string
	n   int
}

func (r *recorder) ack(t *testing.T, op plan.Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	op.Mark = fmt.Sprintf("%s-%d", op.Kind, r.n)
	if err := dm.Message(r.dev, 0, "mark "+op.Mark); err != nil {
		t.Errorf("mark %s: %v", op.Mark, err)
		return
	}
	b, _ := json.Marshal(op)
	fmt.Printf("%s%s\n", plan.MarkPowerloss, b)
}

func TestRecord(t *testing.T) {
	if !testutil.InGuest() || os.Getenv(EnvFS) == "" {
		t.Skip("records the power-loss workload in a guest of make test-powerloss")
	}
	fstype := os.Getenv(EnvFS)
	data, err := diskBySerial(os.Getenv(EnvData))
	if err != nil {
		t.Fatal(err)
	}
	logDev, err := diskBySerial(os.Getenv(EnvLog))
	if err != nil {
		t.Fatal(err)
	}
	n, err := sectors(data)
	if err != nil {
		t.Fatal(err)
	}
	name := "plw-" + fstype
	dev, err := dm.Create(name, []dm.Target{{Start: 0, Length: n, Type: "log-writes", Params: data + " " + logDev}})
	if err != nil {
		t.Fatal(err)
	}
	removed := false
	mnt := "/mnt/powerloss-" + fstype
	defer func() {
		if !removed {
			unix.Unmount(mnt, unix.MNT_DETACH)
			dm.Remove(name)
		}
	}()
	os.MkdirAll(mnt, 0o755)
	if err := unix.Mount(dev, mnt, fstype, 0, ""); err != nil {
		t.Fatalf("mount %s (%s): %v", dev, fstype, err)
	}
	rec := &recorder{dev: name}
	workload(t, rec, filepath.Join(mnt, "state"))
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Errorf("unmount: %v", err)
	}
	if err := dm.Remove(name); err != nil {
		t.Errorf("removing the log-writes device: %v", err)
	}
	removed = true
	fmt.Printf("%s{\"kind\":\"end\",\"mark\":\"end\"}\n", plan.MarkPowerloss)
}

var (
	mountCap = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	blockCap = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
)

// workload runs the real driver on state and drives it: creates (empty,
// from snapshot, from volume; directory and block), snapshots (tar.gz,
// zstd, block), publish and unpublish, expansion, modify and deletes, with
// a writer appending and fsyncing to a file in a volume meanwhile.
func workload(t *testing.T, rec *recorder, state string) {
	sock := "/tmp/powerloss.sock"
	cmd := exec.Command("/bin/hostpathplugin", "--endpoint=unix://"+sock, "--nodeid=powerloss", "--statedir="+state,
		"--enable-controller-modify-volume", "-v=1")
	logs, _ := os.Create("/tmp/powerloss-driver.log")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(unix.SIGTERM)
		cmd.Wait()
		// The driver leaves block volumes attached when it stops (as
		// across a restart); their loop devices hold the file system.
		files, _ := filepath.Glob(filepath.Join(state, "volumes", "*.img"))
		for _, f := range files {
			devs, _ := loop.FindAll(f)
			for _, d := range devs {
				loop.Detach(d)
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile("/tmp/powerloss-driver.log")
			t.Logf("driver log:\n%s", b)
		}
	}()
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	if !testutil.WaitReady(cc, 30*time.Second, nil) {
		t.Fatal("the driver is not ready in 30 s")
	}
	ctl, node := csipb.NewControllerClient(cc), csipb.NewNodeClient(cc)
	must := func(what string, err error) {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	create := func(name string, c *csipb.VolumeCapability, size int64, src *csipb.VolumeContentSource, source string) string {
		r, err := ctl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csipb.VolumeCapability{c},
			CapacityRange: &csipb.CapacityRange{RequiredBytes: size}, VolumeContentSource: src})
		must("CreateVolume "+name, err)
		access := "mount"
		if c == blockCap {
			access = "block"
		}
		rec.ack(t, plan.Op{Kind: "create", ID: r.GetVolume().GetVolumeId(), Access: access, Source: source, Size: r.GetVolume().GetCapacityBytes()})
		return r.GetVolume().GetVolumeId()
	}
	snapshot := func(name, vol string, params map[string]string, format string) string {
		r, err := ctl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: name, SourceVolumeId: vol, Parameters: params})
		must("CreateSnapshot "+name, err)
		rec.ack(t, plan.Op{Kind: "snapshot", ID: r.GetSnapshot().GetSnapshotId(), Source: vol, Format: format})
		return r.GetSnapshot().GetSnapshotId()
	}
	fromSnap := func(id string) *csipb.VolumeContentSource {
		return &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	}
	fromVol := func(id string) *csipb.VolumeContentSource {
		return &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}

	// The writer's volume, then the writer: a record appended and
	// fdatasynced every 100 ms until the workload ends.
	wvol := create("writer", mountCap, 16<<20, nil, "")
	file := fmt.Sprintf(WriterFile, wvol)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		f, err := os.OpenFile(filepath.Join(state, file), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			t.Errorf("writer: %v", err)
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
				t.Errorf("writer: %v", err)
				return
			}
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				t.Errorf("writer: fdatasync: %v", err)
				return
			}
			rec.ack(t, plan.Op{Kind: "write", ID: wvol, File: file, Bytes: int64(i+1) * plan.RecordSize})
		}
	}()

	for round := 0; round < 3; round++ {
		p := fmt.Sprintf("r%d-", round)
		dir := create(p+"dir", mountCap, 8<<20, nil, "")
		// Data in the directory volume, as a pod writes it, made durable
		// before the snapshot (a snapshot archives what is there).
		must("data", os.WriteFile(filepath.Join(state, "volumes", dir, "data"), []byte(strings.Repeat(p+"data ", 20000)), 0o644))
		blk := create(p+"blk", blockCap, 8<<20, nil, "")
		gz := snapshot(p+"gz", dir, map[string]string{"format": "tar.gz"}, "tar.gz")
		zst := snapshot(p+"zst", dir, map[string]string{"compression": "zstd"}, "tar.zst")
		img := snapshot(p+"img", blk, nil, "img")
		create(p+"from-gz", mountCap, 8<<20, fromSnap(gz), gz)
		create(p+"from-zst", mountCap, 8<<20, fromSnap(zst), zst)
		clone := create(p+"clone", mountCap, 8<<20, fromVol(dir), dir)
		create(p+"from-img", blockCap, 16<<20, fromSnap(img), img)
		create(p+"blk-clone", blockCap, 16<<20, fromVol(blk), blk)

		target := filepath.Join("/mnt", p+"target")
		os.MkdirAll(target, 0o755)
		_, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: dir, TargetPath: target, VolumeCapability: mountCap})
		must("NodePublishVolume", err)
		rec.ack(t, plan.Op{Kind: "publish", ID: dir, Target: target})
		_, err = ctl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: dir, CapacityRange: &csipb.CapacityRange{RequiredBytes: 12 << 20}})
		must("ControllerExpandVolume", err)
		rec.ack(t, plan.Op{Kind: "expand", ID: dir, Size: 12 << 20})
		_, err = ctl.ControllerModifyVolume(ctx, &csipb.ControllerModifyVolumeRequest{VolumeId: dir, MutableParameters: map[string]string{"snapshotFormat": "tar.gz"}})
		must("ControllerModifyVolume", err)
		rec.ack(t, plan.Op{Kind: "modify", ID: dir})
		_, err = node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: dir, TargetPath: target})
		must("NodeUnpublishVolume", err)
		rec.ack(t, plan.Op{Kind: "unpublish", ID: dir, Target: target})

		// A delete in flight at a power loss may finish at start or not:
		// the host allows either once it was issued.
		rec.ack(t, plan.Op{Kind: "issue-delete", ID: clone})
		_, err = ctl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: clone})
		must("DeleteVolume", err)
		rec.ack(t, plan.Op{Kind: "delete", ID: clone})
		rec.ack(t, plan.Op{Kind: "issue-delete-snapshot", ID: zst})
		_, err = ctl.DeleteSnapshot(ctx, &csipb.DeleteSnapshotRequest{SnapshotId: zst})
		must("DeleteSnapshot", err)
		rec.ack(t, plan.Op{Kind: "delete-snapshot", ID: zst})
	}
	close(stop)
	wg.Wait()
}
