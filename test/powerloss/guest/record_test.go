// Package guest records the power-loss workload in a kernel-matrix guest
// (make test-powerloss): the state dir on a file system over a
// dm-log-writes target, a pool on a file system of its own (an image on
// that same disk, loop-mounted, so one log orders both), the real driver
// binary serving a workload through the CSI API, and a mark in the log
// after every acknowledged operation and every fsynced write, each also
// printed on the console for the host, which replays the log (test/kernel's
// TestPowerLoss). TestRecover records, the same way, the driver's start on
// disks a first power loss left, for the host to cut the power again
// during that recovery.
package guest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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
	EnvRecover = "POWERLOSS_RECOVER"  // TestRecover: serials data:log:name, space-separated
	WriterFile = "volumes/%s/journal" // the writer's file in its volume
)

// Epoch reads the epoch of the journal in state (0 if it cannot).
func Epoch(state string) uint64 {
	b := make([]byte, 12)
	f, err := os.Open(filepath.Join(state, "meta", "journal"))
	if err != nil {
		return 0
	}
	defer f.Close()
	if _, err := f.ReadAt(b, 0); err != nil || string(b[:4]) != "HPJ1" {
		return 0
	}
	return binary.LittleEndian.Uint64(b[4:12])
}

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
	// state, when set, is the state dir whose journal epoch each op
	// records when it names none: a sample of the replay (make
	// test-powerloss-sample) finds the checkpoints between two ops whose
	// epochs differ.
	state string
}

func (r *recorder) ack(t *testing.T, op plan.Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	op.Mark = fmt.Sprintf("%s-%d", op.Kind, r.n)
	if op.Epoch == 0 && r.state != "" {
		op.Epoch = Epoch(r.state)
	}
	if err := dm.Message(r.dev, 0, "mark "+op.Mark); err != nil {
		t.Errorf("mark %s: %v", op.Mark, err)
		return
	}
	b, _ := json.Marshal(op)
	fmt.Printf("%s%s\n", plan.MarkPowerloss, b)
}

// logged is a disk under dm-log-writes, its file system mounted and the
// pool's image on it mounted too.
type logged struct {
	name, mnt, pool string
	poolDev         loop.Device
}

// mountLogged puts data under a dm-log-writes target named name logging
// to logDev, mounts it, and mounts the pool image on it.
func mountLogged(t *testing.T, name, data, logDev, fstype string) *logged {
	n, err := sectors(data)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := dm.Create(name, []dm.Target{{Start: 0, Length: n, Type: "log-writes", Params: data + " " + logDev}})
	if err != nil {
		t.Fatal(err)
	}
	l := &logged{name: name, mnt: "/mnt/" + name, pool: "/mnt/" + name + "-pool"}
	os.MkdirAll(l.mnt, 0o755)
	if err := unix.Mount(dev, l.mnt, fstype, 0, ""); err != nil {
		dm.Remove(name)
		t.Fatalf("mount %s (%s): %v", dev, fstype, err)
	}
	if l.poolDev, err = loop.Attach(filepath.Join(l.mnt, plan.PoolImage), loop.Options{}); err != nil {
		l.unmount(t)
		t.Fatal(err)
	}
	os.MkdirAll(l.pool, 0o755)
	if err := unix.Mount(l.poolDev.Path(), l.pool, "ext4", 0, ""); err != nil {
		l.unmount(t)
		t.Fatalf("mount the pool: %v", err)
	}
	return l
}

// unmount undoes mountLogged: what was mounted and attached goes.
func (l *logged) unmount(t *testing.T) {
	unix.Unmount(l.pool, 0)
	if l.poolDev.Path() != "" {
		loop.Detach(l.poolDev)
	}
	if err := unix.Unmount(l.mnt, 0); err != nil {
		t.Errorf("unmount %s: %v", l.mnt, err)
		unix.Unmount(l.mnt, unix.MNT_DETACH)
	}
	if err := dm.Remove(l.name); err != nil {
		t.Errorf("removing the log-writes device: %v", err)
	}
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
	l := mountLogged(t, "plw-"+fstype, data, logDev, fstype)
	rec := &recorder{dev: l.name, state: filepath.Join(l.mnt, "state")}
	workload(t, rec, rec.state, l.pool)
	l.unmount(t)
	fmt.Printf("%s{\"kind\":\"end\",\"mark\":\"end\"}\n", plan.MarkPowerloss)
}

// driver is one run of the driver binary.
type driver struct {
	cmd  *exec.Cmd
	cc   *grpc.ClientConn
	logs string
}

func startDriver(t *testing.T, state, pool, logs string) *driver {
	sock := "/tmp/powerloss.sock"
	os.Remove(sock)
	d := &driver{cmd: exec.Command("/bin/hostpathplugin", append(plan.DriverArgs(sock, state, pool), "-v=1")...), logs: logs}
	f, _ := os.OpenFile(logs, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var err error
	if d.cc, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitReady(d.cc, 60*time.Second, nil) {
		b, _ := os.ReadFile(logs)
		t.Fatalf("the driver is not ready in 60 s:\n%s", b)
	}
	return d
}

// stop ends the driver: SIGTERM (a clean stop) or SIGKILL (a crash).
func (d *driver) stop(sig unix.Signal) {
	d.cc.Close()
	d.cmd.Process.Signal(sig)
	d.cmd.Wait()
}

// detachBlock lets go of the loop devices of the block volumes under a
// pool's directory, which the driver leaves attached when it stops.
func detachBlock(dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "volumes", "*.img"))
	for _, f := range files {
		devs, _ := loop.FindAll(f)
		for _, d := range devs {
			loop.Detach(d)
		}
	}
}

// TestRecover starts the driver, as a boot after a power loss does, on
// each disk the host hands it (the state a first power loss left), under
// dm-log-writes, and marks "recovered" once the driver is ready; then it
// is killed (no clean stop). The host replays each log to cut the power
// again during that recovery.
func TestRecover(t *testing.T) {
	if !testutil.InGuest() || os.Getenv(EnvRecover) == "" {
		t.Skip("records recoveries in a guest of make test-powerloss")
	}
	fstype := os.Getenv(EnvFS)
	for _, spec := range strings.Fields(os.Getenv(EnvRecover)) {
		parts := strings.Split(spec, ":")
		data, err := diskBySerial(parts[0])
		if err != nil {
			t.Fatal(err)
		}
		logDev, err := diskBySerial(parts[1])
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%s{\"kind\":\"recovery\",\"mark\":%q}\n", plan.MarkPowerloss, parts[2])
		l := mountLogged(t, "plr-"+parts[2], data, logDev, fstype)
		rec := &recorder{dev: l.name}
		state := filepath.Join(l.mnt, "state")
		d := startDriver(t, state, l.pool, "/tmp/powerloss-recover.log")
		rec.ack(t, plan.Op{Kind: "recovered", Epoch: Epoch(state)})
		d.stop(unix.SIGKILL)
		detachBlock(state)
		detachBlock(l.pool)
		l.unmount(t)
	}
	fmt.Printf("%s{\"kind\":\"end\",\"mark\":\"end\"}\n", plan.MarkPowerloss)
}
