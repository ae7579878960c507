// Package guest is the init of the kernel-matrix guest (make test-kernel):
// its test binary, built static with `go test -c`, is /init of an
// initramfs the host harness (test/kernel) boots in QEMU. As PID 1 it
// mounts /proc, /sys and /dev, loads the kernel modules the plan names with
// finit_module(2), mounts the scratch disk on /tmp, runs each test binary
// of the plan with its output on the serial console, and powers off. It
// is a test so that, like every program that starts others here, it is
// not part of the driver.
package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

func TestGuest(t *testing.T) {
	if os.Getpid() != 1 {
		t.Skip("this is the init of the kernel-matrix guest: make test-kernel boots it in QEMU")
	}
	// Whatever happens, the machine powers off: init must never return,
	// and the host reads a missing done line as a failure.
	defer poweroff()
	p, err := start()
	if err != nil {
		fmt.Printf("%s boot failed: %v\n", plan.Mark, err)
		return
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	fmt.Printf("%s%s\n", plan.MarkKernel, unix.ByteSliceToString(uts.Release[:]))
	for _, r := range p.Runs {
		runOne(r)
	}
	fmt.Println(plan.MarkDone)
}

// start mounts the pseudo file systems, reads the plan, loads its modules
// and mounts the scratch disk.
func start() (plan.Plan, error) {
	var p plan.Plan
	if err := boot(); err != nil {
		return p, err
	}
	b, err := os.ReadFile(plan.Path)
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("plan: %w", err)
	}
	if err := loadModules(p.Modules); err != nil {
		return p, err
	}
	return p, mountScratch(p.Disk)
}

func boot() error {
	// The kernel starts init with 1024/4096 open files; a driver pod gets
	// what the container runtime gives (containerd: 1048576 for both),
	// and the tree walkers hold a descriptor per directory level (the
	// 4,000-deep hostile tree needs about 8,000).
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}); err != nil {
		return fmt.Errorf("raising RLIMIT_NOFILE: %w", err)
	}
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		// cgroup v2 with the io and memory controllers handed down from
		// the root, as systemd and container hosts have it (memory with
		// io makes writeback throttled by io.max): the I/O limits' tests
		// run on v2 here (v1 on the host).
		{"cgroup2", "/sys/fs/cgroup", "cgroup2"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+io +memory"), 0); err != nil {
		return fmt.Errorf("enabling the io and memory controllers of cgroup v2: %w", err)
	}
	return loopbackUp()
}

// loopbackUp brings up lo, which a kernel starts down and nothing else
// here raises: tests that serve on 127.0.0.1 (two drivers pulling from
// each other) need it.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// loadModules loads each module file in order; one that is built in or
// already loaded (EEXIST) is fine, any other refusal is reported and the
// tests run anyway: their failures say what was missing.
func loadModules(files []string) error {
	for _, f := range files {
		fd, err := unix.Open(f, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("module %s: %w", f, err)
		}
		err = unix.FinitModule(fd, "", 0)
		unix.Close(fd)
		if err != nil && err != unix.EEXIST {
			fmt.Printf("%s module %s not loaded: %v\n", plan.Mark, filepath.Base(f), err)
		}
	}
	return nil
}

// mountScratch finds the virtio disk with the given serial (disks appear
// a moment after virtio_blk loads) and mounts it on /tmp.
func mountScratch(serial string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		devs, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, s := range devs {
			if b, _ := os.ReadFile(s); strings.TrimSpace(string(b)) == serial {
				dev := "/dev/" + filepath.Base(filepath.Dir(s))
				os.MkdirAll("/tmp", 0o1777)
				// noinit_itable: the host made the file system with lazy
				// inode tables; zeroing them would take the guest's CPU.
				if err := unix.Mount(dev, "/tmp", "ext4", 0, "noinit_itable"); err != nil {
					return fmt.Errorf("mount %s on /tmp: %w", dev, err)
				}
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no virtio disk with serial %q after 60 s", serial)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runOne runs a test binary in its own directory under /tmp/work, its
// output on the console between two marker lines.
func runOne(r plan.Run) {
	fmt.Printf("%s%s\n", plan.MarkRun, r.Name)
	begin := time.Now()
	dir := filepath.Join("/tmp/work", r.Name)
	rc := 0
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Printf("%s %s: %v\n", plan.Mark, r.Name, err)
		rc = -1
	} else {
		cmd := exec.Command(r.Args[0], r.Args[1:]...)
		cmd.Dir = dir
		cmd.Env = append([]string{"PATH=/bin", "HOME=/tmp", "TMPDIR=/tmp"}, os.Environ()...)
		cmd.Env = append(cmd.Env, r.Env...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		if err := cmd.Run(); err != nil {
			rc = -1
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				rc = ee.ExitCode()
			} else {
				fmt.Printf("%s %s: %v\n", plan.Mark, r.Name, err)
			}
		}
	}
	fmt.Printf("%s%s rc=%d seconds=%.1f\n", plan.MarkEnd, r.Name, rc, time.Since(begin).Seconds())
}

func poweroff() {
	unix.Sync()
	unix.Unmount("/tmp", 0)
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
