package kernel

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	"github.com/hostpath-csi/hostpath/test/powerloss/logwrites"
)

// reID finds the ids and paths that differ between points in a problem.
var reID = regexp.MustCompile(`(vol|snap)-[0-9a-f]{24}|/tmp/powerloss-mnt-[0-9]+|\d+ bytes|record \d+`)

// envPowerloss is the recording test binary (test/powerloss/guest) that
// make test-powerloss builds; its presence turns TestPowerLoss on.
const envPowerloss = "HOSTPATH_POWERLOSS_RECORDER"

// maxPoints is how many flush points are replayed at most, spread over
// the run, besides the points between flushes.
const maxPoints = 300

// fsSpec is a file system the state dir is recorded on.
type fsSpec struct {
	name string
	size int64
	mkfs []string
	fsck []string
}

var powerlossFS = []fsSpec{
	{"ext4", 512 << 20, []string{"mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"}, []string{"e2fsck", "-fn"}},
	{"xfs", 512 << 20, []string{"mkfs.xfs", "-q", "-f"}, []string{"xfs_repair", "-n"}},
}

// TestPowerLoss records the workload of test/powerloss/guest on ext4 and
// XFS in a guest booting the first kernel of HOSTPATH_KERNELS, then
// replays the dm-log-writes log on this host to every flush and FUA
// point (or maxPoints of them) and to points between flushes with a
// random subset of the unflushed writes, and at each one checks what a
// power loss there would leave: the file system recovers and fsck finds
// it clean, the driver is ready within 10 s, every operation acknowledged
// before the point is there with its data, nothing half-made is listed,
// and every fsynced byte of the writer is intact.
func TestPowerLoss(t *testing.T) {
	recorder := os.Getenv(envPowerloss)
	kernels := strings.Fields(os.Getenv(envKernels))
	bin, work := os.Getenv(envBin), os.Getenv(envWork)
	if recorder == "" || len(kernels) == 0 || bin == "" || work == "" {
		t.Skipf("boots a kernel in QEMU and replays what it recorded: run make test-powerloss")
	}
	testutil.RequireRoot(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	k, err := findKernel(kernels[0])
	if err != nil {
		t.Fatal(err)
	}
	work = filepath.Join(work, "powerloss-"+k.release)
	os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	ops := record(t, qemu, k, bin, recorder, work)
	var total, lost int
	for _, fs := range powerlossFS {
		n, l := replay(t, fs, filepath.Join(bin, "hostpathplugin"), work, ops[fs.name])
		fmt.Printf("powerloss %s: %d points, %d lost\n", fs.name, n, l)
		total, lost = total+n, lost+l
	}
	fmt.Printf("%d passed, %d failed\n", total-lost, lost)
}

// record boots the guest once; it records on each file system in turn and
// prints the ops it acknowledged, returned per file system.
func record(t *testing.T, qemu string, k kernelPackage, bin, recorder, work string) map[string][]plan.Op {
	mods, err := moduleClosure(k, append(append([]string{}, modules...), "dm_log_writes"))
	if err != nil {
		t.Fatal(err)
	}
	mk := func(path string, size int64) {
		f, err := os.Create(path)
		if err == nil {
			err = f.Truncate(size)
			f.Close()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	scratch := filepath.Join(work, "scratch.img")
	mk(scratch, 1<<30)
	if err := run("mkfs.ext4", "-q", scratch); err != nil {
		t.Fatal(err)
	}
	pl := plan.Plan{Disk: "scratch"}
	for _, m := range mods {
		pl.Modules = append(pl.Modules, "/lib/modules/"+k.release+strings.TrimPrefix(m, k.modules))
	}
	drives := []string{"-drive", "file=" + scratch + ",format=raw,if=none,id=scratch,cache=unsafe", "-device", "virtio-blk-pci,drive=scratch,serial=scratch"}
	for _, fs := range powerlossFS {
		data, logImg := filepath.Join(work, fs.name+"-base.img"), filepath.Join(work, fs.name+"-log.img")
		mk(data, fs.size)
		if err := run(fs.mkfs[0], append(fs.mkfs[1:], data)...); err != nil {
			t.Fatal(err)
		}
		mk(logImg, 8<<30)
		// The guest writes on a copy: the base stays what mkfs made, the
		// start of every replay.
		if err := run("cp", "--sparse=always", data, filepath.Join(work, fs.name+"-data.img")); err != nil {
			t.Fatal(err)
		}
		for _, d := range []struct{ id, file string }{{fs.name + "-data", filepath.Join(work, fs.name+"-data.img")}, {fs.name + "-log", logImg}} {
			// cache=directsync: a write the guest saw complete is in the
			// image, so the log holds everything dm-log-writes logged.
			drives = append(drives, "-drive", "file="+d.file+",format=raw,if=none,id="+d.id+",cache=directsync",
				"-device", "virtio-blk-pci,drive="+d.id+",serial="+d.id)
		}
		pl.Runs = append(pl.Runs, plan.Run{Name: "record-" + fs.name,
			Args: []string{"/bin/" + filepath.Base(recorder), "-test.v", "-test.count=1", "-test.run=^TestRecord$", "-test.timeout=30m"},
			Env:  []string{"POWERLOSS_FS=" + fs.name, "POWERLOSS_DATA=" + fs.name + "-data", "POWERLOSS_LOG=" + fs.name + "-log"}})
	}
	for _, f := range []string{filepath.Join(bin, "init"), filepath.Join(bin, "hostpathplugin"), recorder} {
		if err := static(f); err != nil {
			t.Fatal(err)
		}
	}
	initrd := filepath.Join(work, "initrd.cpio")
	writeInitramfs(t, initrd, k, bin, []string{recorder}, mods, pl)
	logPath := filepath.Join(work, "console.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"-nodefaults", "-display", "none", "-no-reboot",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "4096",
		"-kernel", k.vmlinuz, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet " + testutil.GuestEnv + "=1", "-serial", "stdio"}, drives...)
	cmd := exec.Command(qemu, args...)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(40*time.Minute, func() { cmd.Process.Kill() })
	defer timer.Stop()
	ops := map[string][]plan.Op{}
	cur := ""
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		fmt.Fprintln(logf, line)
		switch {
		case strings.HasPrefix(line, plan.MarkRun):
			cur = strings.TrimPrefix(strings.TrimPrefix(line, plan.MarkRun), "record-")
			fmt.Println(line)
		case strings.HasPrefix(line, plan.MarkPowerloss):
			var op plan.Op
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, plan.MarkPowerloss)), &op); err != nil {
				t.Errorf("console: %q: %v", line, err)
				continue
			}
			ops[cur] = append(ops[cur], op)
		case strings.HasPrefix(line, plan.Mark), strings.HasPrefix(line, "--- FAIL"), strings.Contains(line, "_test.go:"), strings.Contains(line, "panic"):
			fmt.Println(line)
		}
	}
	werr := cmd.Wait()
	for _, fs := range powerlossFS {
		o := ops[fs.name]
		if len(o) == 0 || o[len(o)-1].Kind != "end" {
			t.Fatalf("the guest did not finish recording on %s (qemu: %v); console log %s", fs.name, werr, logPath)
		}
		ops[fs.name] = o[:len(o)-1]
		fmt.Printf("recorded on %s: %d acknowledged operations and writes (guest time %.0f s so far)\n", fs.name, len(o)-1, time.Since(start).Seconds())
	}
	return ops
}

// point is a state a power loss could leave: the log applied up to entry
// upto (inclusive), plus, when extra is set, those of the entries after
// it up to the next flush. Every operation whose mark comes before the
// next flush (ackedBefore) was acknowledged after its last flush, which is
// at upto or before: all of them must be there.
type point struct {
	upto        int
	extra       []int
	ackedBefore int
}

// replay rebuilds the data disk at each point and checks it. It returns
// the points checked and how many lost something.
func replay(t *testing.T, fs fsSpec, driver, work string, ops []plan.Op) (int, int) {
	lg, err := logwrites.Open(filepath.Join(work, fs.name+"-log.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer lg.Close()
	markAt := map[string]int{}
	var flushes []int
	for _, e := range lg.Entries {
		if e.Flags&logwrites.Mark != 0 {
			markAt[e.Mark] = e.Index
		}
		if e.Flags&(logwrites.Flush|logwrites.FUA) != 0 {
			flushes = append(flushes, e.Index)
		}
	}
	for _, op := range ops {
		if _, ok := markAt[op.Mark]; !ok {
			t.Fatalf("%s: the log has no mark %s", fs.name, op.Mark)
		}
	}
	chosen := flushes
	if len(flushes) > maxPoints {
		chosen = nil
		for i := 0; i < maxPoints; i++ {
			chosen = append(chosen, flushes[i*len(flushes)/maxPoints])
		}
	}
	// Points between flushes: after every tenth chosen flush, a random
	// subset of the writes up to the next flush, as a disk cache that
	// reorders them might leave.
	rng := rand.New(rand.NewPCG(uint64(len(lg.Entries)), 17))
	var points []point
	next := map[int]int{}
	for i, f := range flushes {
		if i+1 < len(flushes) {
			next[f] = flushes[i+1]
		}
	}
	for i, c := range chosen {
		n, ok := next[c]
		if !ok {
			n = len(lg.Entries)
		}
		points = append(points, point{upto: c, ackedBefore: n})
		if ok && i%10 == 0 && n-c > 2 {
			var extra []int
			for e := c + 1; e < n; e++ {
				if rng.IntN(2) == 0 {
					extra = append(extra, e)
				}
			}
			points = append(points, point{upto: c, extra: extra, ackedBefore: n})
		}
	}
	fmt.Printf("powerloss %s: %d log entries, %d flush or FUA points, %d marks; replaying %d points\n", fs.name, len(lg.Entries), len(flushes), len(markAt), len(points))

	wpath := filepath.Join(work, fs.name+"-replay.img")
	if err := run("cp", "--sparse=always", filepath.Join(work, fs.name+"-base.img"), wpath); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(wpath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	applied := -1
	lost := 0
	kinds := map[string]int{} // problems with their ids taken out, and how many points had each
	start := time.Now()
	for i, p := range points {
		for applied < p.upto {
			applied++
			if err := lg.Apply(lg.Entries[applied], w); err != nil {
				t.Fatal(err)
			}
		}
		ppath := filepath.Join(work, fs.name+"-point.img")
		if err := run("cp", "--sparse=always", wpath, ppath); err != nil {
			t.Fatal(err)
		}
		if len(p.extra) > 0 {
			pf, err := os.OpenFile(ppath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range p.extra {
				if err := lg.Apply(lg.Entries[e], pf); err != nil {
					t.Fatal(err)
				}
			}
			pf.Close()
		}
		// What was acknowledged before the power loss could have cut the
		// next flush.
		var acked []plan.Op
		for _, op := range ops {
			if markAt[op.Mark] < p.ackedBefore {
				acked = append(acked, op)
			}
		}
		if problems := checkPoint(t, fs, driver, ppath, acked); len(problems) > 0 {
			lost++
			seen := map[string]bool{}
			for _, pr := range problems {
				k := reID.ReplaceAllString(pr, "ID")
				if !seen[k] {
					seen[k] = true
					kinds[k]++
				}
			}
			if lost <= 10 {
				fmt.Printf("powerloss %s: point %d (entry %d, %d extra writes, %d ops acknowledged): %s\n", fs.name, i, p.upto, len(p.extra), len(acked), strings.Join(problems, "; "))
			}
		}
		os.Remove(ppath)
		if i%50 == 49 {
			fmt.Printf("powerloss %s: %d of %d points checked in %.0f s, %d lost\n", fs.name, i+1, len(points), time.Since(start).Seconds(), lost)
		}
	}
	for k, n := range kinds {
		fmt.Printf("powerloss %s: %d points: %s\n", fs.name, n, k)
	}
	if lost > 0 {
		t.Errorf("powerloss %s: %d of %d points lost something", fs.name, lost, len(points))
	}
	return len(points), lost
}

// checkPoint mounts the image of one point, has fsck check it, starts the
// driver on it and checks the acknowledged operations. It returns what is
// wrong.
func checkPoint(t *testing.T, fs fsSpec, driver, img string, acked []plan.Op) (problems []string) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	dev, err := loop.Attach(img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Detach(dev)
	mnt, err := os.MkdirTemp("", "powerloss-mnt-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(mnt)
	// The first mount replays the journal or log, as a boot after the
	// power loss would; fsck then checks what recovery left.
	if err := syscall.Mount(dev.Path(), mnt, fs.name, 0, ""); err != nil {
		bad("mount after the power loss: %v", err)
		return
	}
	syscall.Unmount(mnt, 0)
	if out, err := exec.Command(fs.fsck[0], append(fs.fsck[1:], dev.Path())...).CombinedOutput(); err != nil {
		bad("%s: %v: %s", fs.fsck[0], err, lastLines(string(out), 3))
	}
	if err := syscall.Mount(dev.Path(), mnt, fs.name, 0, ""); err != nil {
		bad("mount: %v", err)
		return
	}
	defer syscall.Unmount(mnt, syscall.MNT_DETACH)
	state := filepath.Join(mnt, "state")
	if _, err := os.Stat(state); os.IsNotExist(err) && len(acked) == 0 {
		return // before the driver made anything
	}
	sock := filepath.Join(os.TempDir(), fmt.Sprintf("powerloss-%d.sock", os.Getpid()))
	os.Remove(sock)
	cmd := exec.Command(driver, "--endpoint=unix://"+sock, "--nodeid=powerloss", "--statedir="+state, "--enable-controller-modify-volume")
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
		// go before the image is unmounted.
		detachUnder(state)
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
	vols, err := csipb.NewControllerClient(cc).ListVolumes(ctx, &csipb.ListVolumesRequest{})
	if err != nil {
		bad("ListVolumes: %v", err)
		return
	}
	snaps, err := csipb.NewControllerClient(cc).ListSnapshots(ctx, &csipb.ListSnapshotsRequest{})
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
	// by an acknowledged delete.
	wantVol, wantSnap, access := map[string]bool{}, map[string]bool{}, map[string]string{}
	var written int64
	var writerFile string
	sizes := map[string]int64{}
	for _, op := range acked {
		switch op.Kind {
		case "create":
			wantVol[op.ID], access[op.ID], sizes[op.ID] = true, op.Access, op.Size
		case "expand":
			sizes[op.ID] = op.Size
		case "delete", "issue-delete":
			delete(wantVol, op.ID)
		case "snapshot":
			wantSnap[op.ID] = true
		case "delete-snapshot", "issue-delete-snapshot":
			delete(wantSnap, op.ID)
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
	// Nothing half-made is listed: every listed volume and snapshot has
	// its data.
	for id := range listed {
		p := filepath.Join(state, "volumes", id)
		_, err1 := os.Stat(p)
		_, err2 := os.Stat(p + ".img")
		if err1 != nil && err2 != nil {
			bad("listed volume %s has no data", id)
		}
	}
	for id := range snapListed {
		if m, _ := filepath.Glob(filepath.Join(state, "snapshots", id+"*")); len(m) == 0 {
			bad("listed snapshot %s has no data", id)
		}
	}
	// A restore or clone acknowledged is there with its source's data: the
	// file each round wrote before its snapshots (20000 times "rN-data ").
	for _, op := range acked {
		if op.Kind != "create" || op.Source == "" || op.Access != "mount" || !wantVol[op.ID] {
			continue
		}
		b, err := os.ReadFile(filepath.Join(state, "volumes", op.ID, "data"))
		if err != nil || len(b) < 8 || !strings.HasPrefix(string(b), "r") || string(b) != strings.Repeat(string(b[:8]), 20000) {
			bad("acknowledged %s from %s does not hold its source's data (%d bytes, %v)", op.ID, op.Source, len(b), err)
		}
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

// detachUnder detaches the loop devices of the block volumes under state
// (the driver attaches them at start and leaves them attached when it
// stops, as across a restart on a node).
func detachUnder(state string) {
	files, _ := filepath.Glob(filepath.Join(state, "volumes", "*.img"))
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
