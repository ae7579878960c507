package kernel

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
	"github.com/hostpath-csi/hostpath/test/kernel/plan"
	"github.com/hostpath-csi/hostpath/test/powerloss/logwrites"
)

// reID finds the ids and paths that differ between points in a problem.
var reID = regexp.MustCompile(`(vol|snap)-[0-9a-f]{24}|/tmp/powerloss-[a-z]+-[0-9]+|\d+ bytes|record \d+`)

// envPowerloss is the recording test binary (test/powerloss/guest) that
// make test-powerloss builds; its presence turns TestPowerLoss on.
const envPowerloss = "HOSTPATH_POWERLOSS_RECORDER"

// maxPoints is how many flush points of the workload are replayed at
// most, spread over the run; after each, a point between it and the next
// flush is replayed too. maxRecoveryPoints is the same for each recorded
// recovery; recoveries is how many states of the first replay have their
// recovery recorded and cut again.
const (
	maxPoints         = 200
	minPoints         = 300
	maxRecoveryPoints = 24
	recoveries        = 3
)

// fsSpec is a file system the state dir is recorded on.
type fsSpec struct {
	name string
	size int64
	mkfs []string
	fsck []string
}

// (1280 MiB: room for the capacity the workload's volumes reserve, an
// XFS image volume's 300 MiB among them, and the check's restores.)
var powerlossFS = []fsSpec{
	{"ext4", 1280 << 20, []string{"mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"}, []string{"e2fsck", "-fn"}},
	{"xfs", 1280 << 20, []string{"mkfs.xfs", "-q", "-f"}, []string{"xfs_repair", "-n"}},
}

// poolFS is the pool's file system, an image inside the data disk.
var poolFS = fsSpec{"ext4", 128 << 20, []string{"mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"}, []string{"e2fsck", "-fn"}}

// TestPowerLoss records the workload of test/powerloss/guest on ext4 and
// XFS (each with a pool on an ext4 of its own, an image on the same disk)
// in a guest booting the first kernel of HOSTPATH_KERNELS, then replays
// the dm-log-writes log on this host to flush and FUA points (maxPoints
// of them) and, after each, to a point between it and the next flush
// with a random subset of the unflushed writes and one write of several
// 4 KiB blocks torn, and at each checks what a power loss there would leave
// (checkPoint). Then it has the guest record the driver's start on a few
// of those states and replays each recording likewise: a second power
// loss during the recovery from the first.
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
	g := &guestRun{t: t, qemu: qemu, k: k, bin: bin, recorder: recorder, work: work}
	ops := record(t, g)
	driver := filepath.Join(bin, "hostpathplugin")
	var total, lost int
	var again []recovery
	most, keepN := maxPoints, recoveries
	if n := samplePoints(); n > 0 {
		most, keepN = n, 1
		fmt.Printf("powerloss: a sample of %d spread flush points per file system, the points around checkpoints and kills, one recovery each (%s)\n", n, envSample)
	}
	for _, fs := range powerlossFS {
		epochs(fs.name, ops[fs.name])
		n, l, keep := replay(t, fs, driver, filepath.Join(work, fs.name+"-base.img"), filepath.Join(work, fs.name+"-log.img"), ops[fs.name], nil, most, keepN)
		fmt.Printf("powerloss %s: %d points, %d lost\n", fs.name, n, l)
		total, lost = total+n, lost+l
		again = append(again, keep...)
	}
	n, l := recoverAgain(t, g, driver, again)
	total, lost = total+n, lost+l
	// Said again last: a CI log keeps only its tail, and a lost point is
	// what must be read from it.
	for _, line := range lostPoints {
		fmt.Println("lost: " + line)
	}
	fmt.Printf("%d passed, %d failed\n", total-lost, lost)
}

// lostPoints are the first points of each replay that lost something, as
// printed when they were checked (the replays run one after another).
var lostPoints []string

// epochs prints how many checkpoints (each raises the journal's epoch)
// and driver starts the recorded run crossed.
func epochs(fs string, ops []plan.Op) {
	var first, last uint64
	restarts := 0
	for _, op := range ops {
		if op.Kind == "epoch" || op.Kind == "restart" {
			if first == 0 {
				first = op.Epoch
			}
			last = op.Epoch
		}
		if op.Kind == "restart" {
			restarts++
		}
	}
	fmt.Printf("powerloss %s: the run crossed %d checkpoints and epoch changes (journal epoch %d to %d) and %d crash and start of the driver\n", fs, last-first, first, last, restarts)
}

// guestRun boots the power-loss guest.
type guestRun struct {
	t                   *testing.T
	qemu                string
	k                   kernelPackage
	bin, recorder, work string
}

// disk is a drive of the guest.
type disk struct{ id, file, cache string }

// boot runs the guest with disks and runs, and returns the ops it printed
// under each key: the run's name (record-<fs>), or within a run the mark
// of its last "recovery" line.
func (g *guestRun) boot(name string, disks []disk, runs []plan.Run) map[string][]plan.Op {
	t := g.t
	mods, err := moduleClosure(g.k, append(append([]string{}, modules...), "dm_log_writes"))
	if err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(g.work, name+"-scratch.img")
	sparse(t, scratch, 1<<30)
	if err := run("mkfs.ext4", "-q", scratch); err != nil {
		t.Fatal(err)
	}
	pl := plan.Plan{Disk: "scratch", Runs: runs}
	for _, m := range mods {
		pl.Modules = append(pl.Modules, "/lib/modules/"+g.k.release+strings.TrimPrefix(m, g.k.modules))
	}
	drives := []string{"-drive", "file=" + scratch + ",format=raw,if=none,id=scratch,cache=unsafe", "-device", "virtio-blk-pci,drive=scratch,serial=scratch"}
	for _, d := range disks {
		drives = append(drives, "-drive", "file="+d.file+",format=raw,if=none,id="+d.id+",cache="+d.cache,
			"-device", "virtio-blk-pci,drive="+d.id+",serial="+d.id)
	}
	for _, f := range []string{filepath.Join(g.bin, "init"), filepath.Join(g.bin, "hostpathplugin"), g.recorder} {
		if err := static(f); err != nil {
			t.Fatal(err)
		}
	}
	initrd := filepath.Join(g.work, name+"-initrd.cpio")
	writeInitramfs(t, initrd, g.k, g.bin, []string{g.recorder}, mods, pl)
	logPath := filepath.Join(g.work, name+"-console.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"-nodefaults", "-display", "none", "-no-reboot",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "4096",
		"-kernel", g.k.vmlinuz, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet " + testutil.GuestEnv + "=1", "-serial", "stdio"}, drives...)
	cmd := exec.Command(g.qemu, args...)
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
			cur = strings.TrimPrefix(line, plan.MarkRun)
			fmt.Println(line)
		case strings.HasPrefix(line, plan.MarkPowerloss):
			var op plan.Op
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, plan.MarkPowerloss)), &op); err != nil {
				t.Errorf("console: %q: %v", line, err)
				continue
			}
			if op.Kind == "recovery" {
				cur = op.Mark
				continue
			}
			ops[cur] = append(ops[cur], op)
		case strings.HasPrefix(line, plan.Mark), strings.HasPrefix(line, "--- FAIL"), strings.Contains(line, "_test.go:"), strings.Contains(line, "panic"):
			fmt.Println(line)
		}
	}
	werr := cmd.Wait()
	fmt.Printf("guest %s: %.0f s (qemu: %v); console log %s\n", name, time.Since(start).Seconds(), werr, logPath)
	return ops
}

func sparse(t *testing.T, path string, size int64) {
	f, err := os.Create(path)
	if err == nil {
		err = f.Truncate(size)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
}

// record makes each file system's base image (with the pool's image in
// it), boots the guest once to record the workload on each in turn, and
// returns the ops it acknowledged, per file system.
func record(t *testing.T, g *guestRun) map[string][]plan.Op {
	var disks []disk
	var runs []plan.Run
	for _, fs := range powerlossFS {
		base, logImg := filepath.Join(g.work, fs.name+"-base.img"), filepath.Join(g.work, fs.name+"-log.img")
		sparse(t, base, fs.size)
		if err := run(fs.mkfs[0], append(fs.mkfs[1:], base)...); err != nil {
			t.Fatal(err)
		}
		putPool(t, base, fs.name, g.work)
		sparse(t, logImg, 8<<30)
		// The guest writes on a copy: the base stays as made, the start
		// of every replay.
		data := filepath.Join(g.work, fs.name+"-data.img")
		if err := run("cp", "--sparse=always", base, data); err != nil {
			t.Fatal(err)
		}
		// cache=directsync: a write the guest saw complete is in the
		// image, so the log holds everything dm-log-writes logged.
		disks = append(disks, disk{fs.name + "-data", data, "directsync"}, disk{fs.name + "-log", logImg, "directsync"})
		runs = append(runs, plan.Run{Name: "record-" + fs.name,
			Args: []string{"/bin/" + filepath.Base(g.recorder), "-test.v", "-test.count=1", "-test.run=^TestRecord$", "-test.timeout=30m"},
			Env:  []string{"POWERLOSS_FS=" + fs.name, "POWERLOSS_DATA=" + fs.name + "-data", "POWERLOSS_LOG=" + fs.name + "-log"}})
	}
	got := g.boot("record", disks, runs)
	ops := map[string][]plan.Op{}
	for _, fs := range powerlossFS {
		o := got["record-"+fs.name]
		if len(o) == 0 || o[len(o)-1].Kind != "end" {
			t.Fatalf("the guest did not finish recording on %s", fs.name)
		}
		ops[fs.name] = o[:len(o)-1]
		fmt.Printf("recorded on %s: %d acknowledged operations and writes\n", fs.name, len(o)-1)
	}
	return ops
}

// putPool makes the pool's file system as an image and puts it in the
// root of the file system in base.
func putPool(t *testing.T, base, fstype, work string) {
	img := filepath.Join(work, "pool.img")
	sparse(t, img, poolFS.size)
	if err := run(poolFS.mkfs[0], append(poolFS.mkfs[1:], img)...); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(img)
	dev, err := loop.Attach(base, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Detach(dev)
	mnt, err := os.MkdirTemp("", "powerloss-base-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(mnt)
	if err := syscall.Mount(dev.Path(), mnt, fstype, 0, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(mnt, 0)
	if err := run("cp", "--sparse=always", img, filepath.Join(mnt, plan.PoolImage)); err != nil {
		t.Fatal(err)
	}
}

// point is a state a power loss could leave: the log applied up to entry
// upto (inclusive), plus, when extra is set, those of the entries after
// it up to the next flush, and the entry torn applied in part. Every
// operation whose mark comes before the next flush (ackedBefore) was
// acknowledged after its last flush, which is at upto or before: all of
// them must be there.
type point struct {
	upto        int
	extra       []int
	torn        int // -1: none
	ackedBefore int
}

// recovery is a state of the first replay whose recovery the guest
// records: its image, and what was acknowledged there.
type recovery struct {
	fs    fsSpec
	name  string
	image string
	acked []plan.Op
}

// replay rebuilds the data disk at each point and checks it: what already
// holds was acknowledged before the log began (a first power loss), ops
// as their marks come. It returns
// the points checked, how many lost something, and keep states (spread
// over the run, each with acknowledged work) for recoverAgain.
func replay(t *testing.T, fs fsSpec, driver, base, logPath string, ops, already []plan.Op, most, keep int) (int, int, []recovery) {
	lg, err := logwrites.Open(logPath)
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
	// At least minPoints points where the run has them: a file system
	// whose flushes come in pairs (nothing written between them) gets
	// fewer points between flushes, so more flushes are chosen.
	// A sample (envSample) takes its most spread points and the must
	// points, and no more.
	sample := samplePoints() > 0
	var must []int
	if sample {
		must = mustPoints(ops, markAt, flushes)
	}
	points, torn := choosePoints(lg, flushes, most, must)
	for want := most; !sample && len(points) < min(minPoints, 2*len(flushes)) && most > maxRecoveryPoints && want < len(flushes); {
		want += minPoints - len(points)
		points, torn = choosePoints(lg, flushes, want, nil)
	}
	rng := rand.New(rand.NewPCG(uint64(len(lg.Entries)), 19)) // which sectors of a torn write land
	fmt.Printf("powerloss %s: %d log entries, %d flush or FUA points, %d marks; replaying %d points (%d with a torn write, %d flushes around checkpoints, kills and standby commits)\n",
		fs.name, len(lg.Entries), len(flushes), len(markAt), len(points), torn, len(must))

	// The states kept for a recovery: spread over the run, each with the
	// reordered writes after a flush (a state the driver's start must
	// repair).
	keepAt := map[int]bool{}
	for i := 1; i <= keep; i++ {
		for j := i * len(points) / (keep + 1); j < len(points); j++ {
			if len(points[j].extra) > 0 {
				keepAt[j] = true
				break
			}
		}
	}
	wpath := logPath + ".replay"
	if err := run("cp", "--sparse=always", base, wpath); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(wpath)
	w, err := os.OpenFile(wpath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	applied := -1
	lost := 0
	kinds := map[string]int{} // problems with their ids taken out, and how many points had each
	var kept []recovery
	start := time.Now()
	for i, p := range points {
		for applied < p.upto {
			applied++
			if err := lg.Apply(lg.Entries[applied], w); err != nil {
				t.Fatal(err)
			}
		}
		ppath := logPath + ".point"
		if err := run("cp", "--sparse=always", wpath, ppath); err != nil {
			t.Fatal(err)
		}
		if len(p.extra) > 0 || p.torn >= 0 {
			pf, err := os.OpenFile(ppath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range p.extra {
				if e != p.torn {
					if err := lg.Apply(lg.Entries[e], pf); err != nil {
						t.Fatal(err)
					}
				}
			}
			if p.torn >= 0 {
				// Torn at 4 KiB: the physical sector of today's disks and
				// the file systems' block, which they write whole. (Torn
				// at 512 bytes, a pool's ext4 superblock failed its
				// checksum at the mount: the file system's, not the
				// driver's, to survive.)
				per := int(4096 / lg.SectorSize)
				kept := map[int]bool{}
				keep := func(i int) bool {
					k, ok := kept[i/per]
					if !ok {
						k = rng.IntN(2) == 0
						kept[i/per] = k
					}
					return k
				}
				if err := lg.ApplyTorn(lg.Entries[p.torn], pf, keep); err != nil {
					t.Fatal(err)
				}
			}
			pf.Close()
		}
		// What was acknowledged before the power loss could have cut the
		// next flush.
		acked := append([]plan.Op{}, already...)
		for _, op := range ops {
			if markAt[op.Mark] < p.ackedBefore {
				acked = append(acked, op)
			}
		}
		if keepAt[i] {
			// Kept before the check: the check's own start changes it.
			img := fmt.Sprintf("%s.recover-%d", logPath, i)
			if err := run("cp", "--sparse=always", ppath, img); err != nil {
				t.Fatal(err)
			}
			kept = append(kept, recovery{fs: fs, name: fmt.Sprintf("%s-%d", fs.name, i), image: img, acked: acked})
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
				line := fmt.Sprintf("powerloss %s: point %d (entry %d, %d extra writes, torn %d, %d ops acknowledged): %s", fs.name, i, p.upto, len(p.extra), p.torn, len(acked), strings.Join(problems, "; "))
				fmt.Println(line)
				lostPoints = append(lostPoints, line)
			}
		}
		os.Remove(ppath)
		if i%50 == 49 {
			fmt.Printf("powerloss %s: %d of %d points checked in %.0f s, %d lost\n", fs.name, i+1, len(points), time.Since(start).Seconds(), lost)
		}
	}
	var ks []string
	for k := range kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		fmt.Printf("powerloss %s: %d points: %s\n", fs.name, kinds[k], k)
	}
	if lost > 0 {
		t.Errorf("powerloss %s: %d of %d points lost something", fs.name, lost, len(points))
	}
	return len(points), lost, kept
}

// recoverAgain has the guest record the driver's start on each kept
// state, then replays each recording to its flush points and checks that
// what was acknowledged before the first power loss survives a second one
// during the recovery from it.
func recoverAgain(t *testing.T, g *guestRun, driver string, kept []recovery) (int, int) {
	if len(kept) == 0 {
		t.Error("no state was kept for a recovery")
		return 0, 0
	}
	var disks []disk
	var runs []plan.Run
	byFS := map[string][]string{}
	for _, r := range kept {
		// The guest writes on a copy: the kept image is the replay's base.
		data := r.image + ".data"
		if err := run("cp", "--sparse=always", r.image, data); err != nil {
			t.Fatal(err)
		}
		logImg := r.image + ".log"
		sparse(t, logImg, 2<<30)
		disks = append(disks, disk{"d-" + r.name, data, "directsync"}, disk{"l-" + r.name, logImg, "directsync"})
		byFS[r.fs.name] = append(byFS[r.fs.name], "d-"+r.name+":l-"+r.name+":"+r.name)
	}
	for _, fs := range powerlossFS {
		if len(byFS[fs.name]) == 0 {
			continue
		}
		runs = append(runs, plan.Run{Name: "recover-" + fs.name,
			Args: []string{"/bin/" + filepath.Base(g.recorder), "-test.v", "-test.count=1", "-test.run=^TestRecover$", "-test.timeout=20m"},
			Env:  []string{"POWERLOSS_FS=" + fs.name, "POWERLOSS_RECOVER=" + strings.Join(byFS[fs.name], " ")}})
	}
	got := g.boot("recover", disks, runs)
	var total, lost int
	for _, r := range kept {
		ops := got[r.name]
		if n := len(ops); n > 0 && ops[n-1].Kind == "end" { // the run's end, after its last recovery
			ops = ops[:n-1]
		}
		if len(ops) == 0 || ops[len(ops)-1].Kind != "recovered" {
			t.Errorf("the guest did not record the recovery of %s", r.name)
			continue
		}
		// What must survive is what the first power loss had to keep.
		n, l, _ := replay(t, r.fs, driver, r.image, r.image+".log", ops, r.acked, maxRecoveryPoints, 0)
		fmt.Printf("powerloss %s: a second power loss during its recovery: %d points, %d lost\n", r.name, n, l)
		total, lost = total+n, lost+l
	}
	return total, lost
}
