package fsops_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// TestMountDevice mounts an in-process ext4 from its loop device: the
// mount point then shows the device's file system (st_dev is the device),
// takes a write, and refuses a symlinked target and a missing device.
func TestMountDevice(t *testing.T) {
	testutil.RequireRoot(t)
	dev, err := loop.Attach(ext4Image(t, 64<<20), loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	base := t.TempDir()
	mnt, link := filepath.Join(base, "mnt"), filepath.Join(base, "link")
	os.Mkdir(mnt, 0o755)
	os.Symlink(mnt, link)
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })

	cases := []struct {
		name, dev, target string
		want              error
	}{
		{"symlinked target", dev.Path(), link, unix.ELOOP},
		{"no such device", filepath.Join(base, "nodev"), mnt, unix.ENOENT},
		{"the device", dev.Path(), mnt, nil},
	}
	for _, tc := range cases {
		err := fsops.MountDevice(tc.dev, tc.target, "ext4", unix.MS_NOATIME, "")
		if !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	mp, err := fsops.GetMountPoint(mnt)
	if err != nil || mp == nil {
		t.Fatalf("mount point: %v %v", mp, err)
	}
	if mp.FSType != "ext4" || mp.Dev != dev.Rdev || !mp.HasOption("noatime") {
		t.Fatalf("mount point %+v, want ext4,noatime on device %d", mp, dev.Rdev)
	}
	if err := os.WriteFile(filepath.Join(mnt, "x"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fsops.Unmount(mnt); err != nil {
		t.Fatal(err)
	}
}
