// Package testutil holds what the privileged tests share: the rule that a
// test needing root runs or fails, never skips silently, and helpers to
// build and run the real binary.
package testutil

import (
	"os"
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
