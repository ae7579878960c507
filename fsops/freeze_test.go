package fsops_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/format/ext4"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// TestFreezeThaw on an ext4 made in-process (so the kernel guests run it
// too): a write started while the file system is frozen does not finish
// until it is thawed; a second freeze is EBUSY; ThawIfFrozen thaws a
// frozen one once and then reports nothing to do.
func TestFreezeThaw(t *testing.T) {
	testutil.RequireRoot(t)
	mnt := mountedExt4(t, 128<<20)
	if err := fsops.Freeze(mnt); err != nil {
		t.Fatal(err)
	}
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			fsops.Thaw(mnt) // never leave a test's file system frozen
		}
	})
	if err := fsops.Freeze(mnt); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("second freeze: %v, want EBUSY", err)
	}
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(mnt, "during"), []byte("x"), 0o644) }()
	select {
	case err := <-done:
		t.Fatalf("a write finished on a frozen file system (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	was, err := fsops.ThawIfFrozen(mnt)
	if err != nil || !was {
		t.Fatalf("ThawIfFrozen of a frozen file system: %v, %v", was, err)
	}
	thawed = true
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write did not finish after the thaw")
	}
	if was, err := fsops.ThawIfFrozen(mnt); err != nil || was {
		t.Fatalf("ThawIfFrozen of a thawed file system: %v, %v", was, err)
	}
	if err := fsops.Thaw(mnt); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("thaw of a thawed file system: %v, want EINVAL", err)
	}
}

// TestFreezeHeld: while frozen through FreezeHeld, the mount cannot be
// unmounted (EBUSY, at once: nothing waits on the frozen file system),
// a write waits, and the thaw through the held descriptor lets both go.
func TestFreezeHeld(t *testing.T) {
	testutil.RequireRoot(t)
	mnt := mountedExt4(t, 64<<20)
	thaw, err := fsops.FreezeHeld(mnt, devOf(t, mnt))
	if err != nil {
		t.Fatal(err)
	}
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			thaw()
		}
	})
	start := time.Now()
	if err := fsops.Unmount(mnt); !errors.Is(err, unix.EBUSY) || time.Since(start) > 5*time.Second {
		t.Fatalf("unmount while frozen: %v after %v, want EBUSY at once", err, time.Since(start))
	}
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(mnt, "during"), []byte("x"), 0o644) }()
	select {
	case err := <-done:
		t.Fatalf("a write finished on a frozen file system (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the write did not finish after the thaw")
	}
	if was, err := fsops.ThawIfFrozen(mnt); err != nil || was {
		t.Fatalf("after the held thaw: frozen=%v, %v", was, err)
	}
}

// TestFreezeHeldChecksTheDevice: a staging path unmounted between the
// driver's check and its freeze is a bare directory on whatever file
// system holds it; FreezeHeld and ThawOn, told the device they expect,
// refuse it (ESTALE) and leave that file system alone. Here the outer file
// system is the test's own, so a regression freezes nothing of the host's.
func TestFreezeHeldChecksTheDevice(t *testing.T) {
	testutil.RequireRoot(t)
	outer := mountedExt4(t, 64<<20)
	inner := filepath.Join(outer, "staging")
	if err := os.Mkdir(inner, 0o755); err != nil {
		t.Fatal(err)
	}
	img := ext4Image(t, 64<<20)
	dev, err := loop.Attach(img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	if err := unix.Mount(dev.Path(), inner, "ext4", 0, ""); err != nil {
		t.Fatal(err)
	}
	innerDev := devOf(t, inner)
	if innerDev == devOf(t, outer) {
		t.Fatal("the inner mount is on the outer device")
	}
	if err := unix.Unmount(inner, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fsops.ThawIfFrozen(outer) })
	if _, err := fsops.FreezeHeld(inner, innerDev); !errors.Is(err, unix.ESTALE) {
		t.Fatalf("FreezeHeld of a path no longer on its device: %v, want ESTALE", err)
	}
	if was, err := fsops.ThawOn(inner, innerDev); !errors.Is(err, unix.ESTALE) || was {
		t.Fatalf("ThawOn of a path no longer on its device: %v %v, want ESTALE", was, err)
	}
	// The outer file system was never frozen: a write goes through.
	if was, err := fsops.ThawIfFrozen(outer); err != nil || was {
		t.Fatalf("the outer file system was frozen (%v, %v)", was, err)
	}
	// On the right device both work, and ThawOn says it thawed.
	thaw, err := fsops.FreezeHeld(outer, devOf(t, outer))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fsops.FreezeHeld(outer, devOf(t, outer)); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("a second freeze: %v, want EBUSY", err)
	}
	if was, err := fsops.ThawOn(outer, devOf(t, outer)); err != nil || !was {
		t.Fatalf("ThawOn of a frozen file system: %v %v", was, err)
	}
	// The held thaw of a file system someone else thawed is done, not an error.
	if err := thaw(); err != nil {
		t.Fatalf("the held thaw after another thaw: %v", err)
	}
}

// devOf is the device of the file system holding path.
func devOf(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Dev
}

// mountedExt4 is an ext4 made in-process (so the kernel guests run the
// test too) on a fresh image of size bytes, loop-mounted until the test
// ends.
func mountedExt4(t *testing.T, size int64) string {
	t.Helper()
	return testfs.MountImage(t, ext4Image(t, size), "ext4", "")
}

// ext4Image is a fresh image of size bytes holding an in-process ext4.
func ext4Image(t *testing.T, size int64) string {
	t.Helper()
	img := testfs.NewImage(t, size)
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ext4.Format(f, ext4.Options{}); err != nil {
		t.Fatal(err)
	}
	return img
}
