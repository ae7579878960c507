// Package testutil holds what the privileged tests share: the rule that a
// test needing root runs or fails, never skips silently, and helpers to
// build and run the real binary.
package testutil

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// SkipEnv is the one switch that lets privileged tests skip: set
// HOSTPATH_SKIP_PRIVILEGED=1 on a machine that is not a privileged runner.
const SkipEnv = "HOSTPATH_SKIP_PRIVILEGED"

// RequireRoot fails the test when not root, unless SkipEnv asks to skip.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(SkipEnv) != "" {
		t.Skipf("not root and %s is set: skipping privileged test", SkipEnv)
	}
	t.Fatalf("this test needs root (mounts, loop devices); run as root or set %s=1 to skip it", SkipEnv)
}

// UnmountUnder detaches every mount below dir and reports each as a test
// error: for t.Cleanup, so a failed run leaves nothing mounted and
// TempDir can be removed.
func UnmountUnder(t testing.TB, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir) {
			t.Errorf("mount left behind: %s", f[4])
			if err := syscall.Unmount(f[4], syscall.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", f[4], err)
			}
		}
	}
}

// GuestEnv is set by the kernel-matrix harness (make test-kernel) in the
// QEMU guest, which has a kernel and the test binaries but no userland:
// no mkfs, no tar, no shell.
const GuestEnv = "HOSTPATH_GUEST"

// InGuest reports whether the test runs in that guest.
func InGuest() bool { return os.Getenv(GuestEnv) != "" }

// HaveTools reports whether the test may start the shell tools it compares
// against. In the guest it may not (there are none); the test says so in
// its log and the host run covers that part.
func HaveTools(t testing.TB, what string) bool {
	t.Helper()
	if InGuest() {
		t.Logf("%s=1: no userland in the kernel guest, %s not run here (the host run covers it)", GuestEnv, what)
		return false
	}
	return true
}

// KernelHas reports whether the running kernel was built with option
// (=y or =m), from /proc/config.gz or, where the kernel does not carry its
// configuration (Debian's), /boot/config-<release>. A kernel whose
// configuration cannot be found fails the test: guessing would turn an
// enforcement test into an absence test without anyone noticing.
func KernelHas(t testing.TB, option string) bool {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatalf("uname: %v", err)
	}
	rel := unix.ByteSliceToString(uts.Release[:])
	var config []byte
	if f, err := os.Open("/proc/config.gz"); err == nil {
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		if config, err = io.ReadAll(zr); err != nil {
			t.Fatal(err)
		}
	} else if config, err = os.ReadFile("/boot/config-" + rel); err != nil {
		t.Fatalf("cannot tell whether kernel %s has %s: no /proc/config.gz and %v", rel, option, err)
	}
	return bytes.Contains(config, []byte("\n"+option+"=y")) || bytes.Contains(config, []byte("\n"+option+"=m"))
}

// AsPod runs fn on an OS thread whose effective capabilities lack
// CAP_SYS_RESOURCE, as a pod's container process has by default. The
// kernel lets a process holding it write past VFS quota limits (ext4's
// project quotas, as dquot's ignore_hardlimit says); tests that check
// enforcement write as a pod would. The thread is discarded afterwards.
func AsPod(t testing.TB, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the goroutine's end discards the thread with
		// its reduced capabilities.
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capget: %w", err)
			return
		}
		data[unix.CAP_SYS_RESOURCE/32].Effective &^= 1 << (unix.CAP_SYS_RESOURCE % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("capset: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// HasCap reports whether this process holds capability c in its
// effective set (this VM's root lacks CAP_SYS_RESOURCE; the kernel
// guests' init holds every one).
func HasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}
