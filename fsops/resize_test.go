package fsops_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/format/ext4"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// TestGrowExt4Online: an ext4 made by format/ext4 (no resize inode) grows
// while mounted and written to, across group-descriptor blocks (from 256
// MiB to 20 GiB: 2 to 160 groups, one descriptor block to two), keeps its
// files, shows the new size in statfs, and e2fsck finds it clean after.
// The kernel lets only CAP_SYS_RESOURCE resize; where the test runs
// without it (this project's CI host drops it), it checks the refusal is
// EPERM and leaves the file system as it was and clean, and the kernel
// guests of make test-kernel (full root) grow it.
func TestGrowExt4Online(t *testing.T) {
	testutil.RequireRoot(t)
	canResize := testutil.HasCap(unix.CAP_SYS_RESOURCE)
	dir := t.TempDir()
	img := filepath.Join(dir, "vol.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(256 << 20)
	if _, err := ext4.Format(f, ext4.Options{}); err != nil {
		t.Fatal(err)
	}
	dev, err := loop.Attach(img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if err := unix.Mount(dev.Path(), mnt, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	data := bytes.Repeat([]byte("grow "), 200<<10)
	write := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if err := os.WriteFile(filepath.Join(mnt, fmt.Sprintf("f%d-%d", n, i)), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(10)
	for _, size := range []int64{1 << 30, 20 << 30} {
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if err := loop.Resize(dev); err != nil {
			t.Fatal(err)
		}
		var before unix.Statfs_t
		unix.Statfs(mnt, &before)
		err := fsops.GrowExt4(mnt, uint64(size)/4096)
		var s unix.Statfs_t
		unix.Statfs(mnt, &s)
		if !canResize {
			if !errors.Is(err, unix.EPERM) || s.Blocks != before.Blocks {
				t.Fatalf("without CAP_SYS_RESOURCE: %v and %d blocks (was %d), want EPERM and no change", err, s.Blocks, before.Blocks)
			}
			t.Logf("no CAP_SYS_RESOURCE here: growth refused with EPERM, nothing changed (make test-kernel grows it)")
			break
		}
		if err != nil {
			t.Fatalf("growing to %d bytes: %v", size, err)
		}
		// statfs leaves out the metadata (inode tables and journal: 3.1%
		// of 1 GiB measured).
		if got := int64(s.Blocks) * s.Bsize; got < size*94/100 || got > size {
			t.Fatalf("after growing to %d bytes statfs says %d", size, got)
		}
		write(20)
	}
	f.Close()
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if !testutil.HaveTools(t, "e2fsck") {
		return
	}
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn after growing: %v\n%s", err, out)
	}
}
