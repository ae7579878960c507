package testfs

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// PoolDir bind-mounts a fresh file system of fstype at a new directory and
// returns both: a pool's directory, and its disk, which the test can take
// away (unmount dir) and bring back (Bind again).
func PoolDir(t testing.TB, run Run, fstype string) (dir, disk string) {
	t.Helper()
	disk = FileSystem(t, run, fstype, 300<<20, nil, "")
	return PoolOn(t, disk, fstype), disk
}

// PoolOn bind-mounts disk (a mounted file system, or a directory of one)
// at a new directory named for name, unmounted when the test ends.
func PoolOn(t testing.TB, disk, name string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name+"-pool")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	Bind(t, disk, dir)
	t.Cleanup(func() {
		testutil.UnmountUnder(t, dir+"/")
		if err := unix.Unmount(dir, 0); err != nil && err != unix.EINVAL {
			t.Errorf("unmounting pool %s: %v", dir, err)
		}
	})
	return dir
}

// Bind bind-mounts disk at dir; the caller's cleanup unmounts it.
func Bind(t testing.TB, disk, dir string) {
	t.Helper()
	if err := unix.Mount(disk, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
}
