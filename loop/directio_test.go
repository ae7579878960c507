package loop_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/format/ext4"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// freshExt4 mounts a new ext4 (made in-process, so the kernel guests,
// which have no mkfs, run this too) and returns its mount point.
func freshExt4(t *testing.T) string {
	t.Helper()
	img := testfs.NewImage(t, 256<<20)
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ext4.Format(f, ext4.Options{}); err != nil {
		t.Fatal(err)
	}
	return testfs.MountImage(t, img, "ext4", "")
}

// TestDirectIO: a device on ext4 takes direct I/O (the status says so,
// and bytes written through it read back), and gives it up again; one on
// ramfs, which has no O_DIRECT, is refused with EINVAL and keeps working
// buffered.
func TestDirectIO(t *testing.T) {
	testutil.RequireRoot(t)
	mnt := freshExt4(t)
	p := filepath.Join(mnt, "vol.img")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Truncate(p, 8<<20)
	d := attachDev(t, p)
	if err := loop.SetDirectIO(d, true); err != nil {
		t.Fatalf("direct I/O on ext4: %v", err)
	}
	if info, err := loop.Status(d); err != nil || info.Flags&unix.LO_FLAGS_DIRECT_IO == 0 {
		t.Fatalf("status after SetDirectIO: flags %x, %v", info.Flags, err)
	}
	writeRead(t, d)
	if err := loop.SetDirectIO(d, false); err != nil {
		t.Fatal(err)
	}
	if info, _ := loop.Status(d); info.Flags&unix.LO_FLAGS_DIRECT_IO != 0 {
		t.Fatalf("direct I/O still on: flags %x", info.Flags)
	}

	ram := filepath.Join(t.TempDir(), "ram")
	os.Mkdir(ram, 0o755)
	if err := unix.Mount("ramfs", ram, "ramfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(ram, unix.MNT_DETACH) })
	rp := filepath.Join(ram, "vol.img")
	os.WriteFile(rp, make([]byte, 1<<20), 0o600)
	rd := attachDev(t, rp)
	if err := loop.SetDirectIO(rd, true); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("direct I/O on ramfs: %v, want EINVAL", err)
	}
	writeRead(t, rd)
}

// writeRead writes a block through the device and reads it back.
func writeRead(t *testing.T, d loop.Device) {
	t.Helper()
	f, err := os.OpenFile(d.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := make([]byte, 4096)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if _, err := f.WriteAt(want, 8192); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, 8192); err != nil || string(got) != string(want) {
		t.Fatalf("read back through %s: %v", d.Path(), err)
	}
}

// attachDev attaches path and detaches it in t.Cleanup.
func attachDev(t *testing.T, path string) loop.Device {
	t.Helper()
	d, err := loop.Attach(path, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(d) })
	return d
}

// TestAttachDirectIO: Options.DirectIO binds the device with direct I/O in
// the one call where the backing file takes it (the status says so, and
// Device.DirectIO), and binds it buffered, without an error, where it does
// not (ramfs has no O_DIRECT); either way the device reads back what it
// was written.
func TestAttachDirectIO(t *testing.T) {
	testutil.RequireRoot(t)
	ram := filepath.Join(t.TempDir(), "ram")
	os.Mkdir(ram, 0o755)
	if err := unix.Mount("ramfs", ram, "ramfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(ram, unix.MNT_DETACH) })
	ext4Dir := freshExt4(t)
	for _, tc := range []struct {
		name string
		dir  string
		opts loop.Options
		want bool
	}{
		{"ext4, direct I/O", ext4Dir, loop.Options{DirectIO: true}, true},
		{"ext4, direct I/O at 4 KiB blocks", ext4Dir, loop.Options{DirectIO: true, BlockSize: 4096}, true},
		{"ext4, buffered", ext4Dir, loop.Options{}, false},
		{"ramfs, direct I/O asked", ram, loop.Options{DirectIO: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(tc.dir, strings.NewReplacer(" ", "_", "/", "-", ",", "").Replace(tc.name)+".img")
			if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			d, err := loop.Attach(p, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { loop.Detach(d) })
			info, err := loop.Status(d)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.Flags&unix.LO_FLAGS_DIRECT_IO != 0; got != tc.want || d.DirectIO != tc.want {
				t.Fatalf("direct I/O: status %v, Device.DirectIO %v, want %v", got, d.DirectIO, tc.want)
			}
			writeRead(t, d)
		})
	}
}
