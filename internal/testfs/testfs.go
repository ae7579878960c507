// Package testfs makes loop-mounted file systems for privileged tests and
// undoes them in t.Cleanup.
package testfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// NewImage makes a sparse file of size bytes for a test file system; the
// test formats it (mkfs runs in the test, never in the driver).
func NewImage(t testing.TB, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fs.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return p
}

// MountImage attaches a formatted image to a loop device and mounts it on
// a fresh directory with the given options. Both are undone in
// t.Cleanup, also when the test fails.
func MountImage(t testing.TB, image, fstype, options string) string {
	t.Helper()
	dev, err := loop.Attach(image, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev.Path(), mnt, fstype, 0, options); err != nil {
		t.Fatalf("mounting %s (%s, %q): %v", image, fstype, options, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt
}

// Run starts a program for a test. The test passes its own (exec-based)
// runner: this package stays free of os/exec, like everything that is not
// a test or a benchmark.
type Run func(name string, args ...string) error

// FileSystem makes a loop-mounted file system of the given type for a
// test: mkfs.<fstype> on a fresh image, mounted with options; setup (for
// example "btrfs quota enable") runs on the mount point if given.
func FileSystem(t testing.TB, run Run, fstype string, size int64, mkfsArgs []string, options string, setup ...[]string) string {
	t.Helper()
	testutil.RequireRoot(t)
	img := NewImage(t, size)
	if err := run("mkfs."+fstype, append(append([]string{"-q"}, mkfsArgs...), img)...); err != nil {
		t.Fatalf("mkfs.%s: %v", fstype, err)
	}
	mnt := MountImage(t, img, fstype, options)
	for _, cmd := range setup {
		args := append(append([]string{}, cmd[1:]...), mnt)
		if err := run(cmd[0], args...); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	return mnt
}
