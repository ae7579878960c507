// Package testutil holds what the privileged tests share: the rule that a
// test needing root runs or fails, never skips silently, and helpers to
// build and run the real binary.
package testutil

import (
	"os"
	"strings"
	"syscall"
	"testing"
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
			syscall.Unmount(f[4], syscall.MNT_DETACH)
			t.Errorf("mount left behind: %s", f[4])
		}
	}
}
