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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Plan is what the host asks the guest to do; the host writes it to
// /plan.json in the initramfs. The host harness has the same type.
type Plan struct {
	Modules []string // module files, dependencies first
	Disk    string   // serial of the scratch disk, mounted on /tmp
	Runs    []Run
}

// Run is one test binary's run.
type Run struct {
	Name string
	Args []string // Args[0] is the binary
	Env  []string
}

// Lines the host harness reads off the console.
const (
	markRun  = "@@guest run "
	markEnd  = "@@guest end "
	markDone = "@@guest done"
)

func TestGuest(t *testing.T) {
	if os.Getpid() != 1 {
		t.Skip("this is the init of the kernel-matrix guest: make test-kernel boots it in QEMU")
	}
	// Whatever happens, the machine powers off: init must never return,
	// and the host reads a missing done line as a failure.
	defer poweroff()
	if err := boot(); err != nil {
		fmt.Printf("@@guest boot failed: %v\n", err)
		return
	}
	b, err := os.ReadFile("/plan.json")
	if err != nil {
		fmt.Printf("@@guest boot failed: %v\n", err)
		return
	}
	var plan Plan
	if err := json.Unmarshal(b, &plan); err != nil {
		fmt.Printf("@@guest boot failed: plan: %v\n", err)
		return
	}
	if err := loadModules(plan.Modules); err != nil {
		fmt.Printf("@@guest boot failed: %v\n", err)
		return
	}
	if err := mountScratch(plan.Disk); err != nil {
		fmt.Printf("@@guest boot failed: %v\n", err)
		return
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	fmt.Printf("@@guest kernel %s\n", unix.ByteSliceToString(uts.Release[:]))
	for _, r := range plan.Runs {
		runOne(r)
	}
	fmt.Println(markDone)
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
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
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
			fmt.Printf("@@guest module %s not loaded: %v\n", filepath.Base(f), err)
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
func runOne(r Run) {
	fmt.Printf("%s%s\n", markRun, r.Name)
	start := time.Now()
	dir := filepath.Join("/tmp/work", r.Name)
	rc := 0
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Printf("@@guest %s: %v\n", r.Name, err)
		rc = -1
	} else {
		cmd := exec.Command(r.Args[0], r.Args[1:]...)
		cmd.Dir = dir
		cmd.Env = append([]string{"PATH=/bin", "HOME=/tmp", "TMPDIR=/tmp"}, os.Environ()...)
		cmd.Env = append(cmd.Env, r.Env...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		if err := cmd.Run(); err != nil {
			rc = -1
			if ee, ok := err.(*exec.ExitError); ok {
				rc = ee.ExitCode()
			} else {
				fmt.Printf("@@guest %s: %v\n", r.Name, err)
			}
		}
	}
	fmt.Printf("%s%s rc=%d seconds=%.1f\n", markEnd, r.Name, rc, time.Since(start).Seconds())
}

func poweroff() {
	unix.Sync()
	unix.Unmount("/tmp", 0)
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
