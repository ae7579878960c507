// Package testfs makes loop-mounted file systems for privileged tests and
// undoes them in t.Cleanup.
package testfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	t.Cleanup(func() {
		if err := loop.Detach(dev); err != nil {
			t.Errorf("detaching %s: %v", dev.Path(), err)
		}
	})
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev.Path(), mnt, fstype, 0, options); err != nil {
		t.Fatalf("mounting %s (%s, %q): %v", image, fstype, options, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", mnt, err)
			}
		}
	})
	return mnt
}

// Run starts a program for a test. The test passes its own (exec-based)
// runner: this package stays free of os/exec, like everything that is not
// a test or a benchmark.
type Run func(name string, args ...string) error

// Spec says how to make a test file system: mkfs.<FSType> with MkfsArgs on
// a sparse image of Size bytes, then each Setup command (its last argument
// the mount point) with the file system mounted.
type Spec struct {
	FSType   string
	Size     int64
	MkfsArgs []string
	Setup    [][]string
}

// Key names the file system a Spec makes, as a file name: the kernel
// harness prepares one template image per key on the host.
func (s Spec) Key() string {
	k := fmt.Sprintf("%s-%dM", s.FSType, s.Size>>20)
	for _, a := range s.MkfsArgs {
		k += "_" + a
	}
	for _, c := range s.Setup {
		k += "+" + strings.Join(c, "-")
	}
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_+,=.", r) {
			return r
		}
		return '~'
	}, k)
}

// TemplatesEnv names the directory of template images (Key()+".img") that
// FileSystem copies instead of running mkfs. The kernel harness sets it in
// its guest, which has no mkfs.
const TemplatesEnv = "HOSTPATH_TESTFS_TEMPLATES"

// FileSystem makes a loop-mounted file system of the given type for a
// test: mkfs.<fstype> on a fresh image, mounted with options; setup (for
// example "btrfs quota enable") runs on the mount point if given. In the
// kernel guest it copies the template the host made for the same Spec.
func FileSystem(t testing.TB, run Run, fstype string, size int64, mkfsArgs []string, options string, setup ...[]string) string {
	t.Helper()
	testutil.RequireRoot(t)
	spec := Spec{FSType: fstype, Size: size, MkfsArgs: mkfsArgs, Setup: setup}
	if testutil.InGuest() {
		if fstype == "xfs" {
			// Every copy of a template has its UUID, and XFS refuses a
			// second mount of one UUID: a test's file system still alive
			// after its test (unmounted lazily while something held it)
			// would fail every later test's mount of the same template.
			options = strings.TrimPrefix(options+",nouuid", ",")
		}
		return MountImage(t, fromTemplate(t, spec), fstype, options)
	}
	img := NewImage(t, size)
	if err := mkfs(run, spec, img); err != nil {
		t.Fatal(err)
	}
	mnt := MountImage(t, img, fstype, options)
	if err := runSetup(run, spec, mnt); err != nil {
		t.Fatal(err)
	}
	return mnt
}

// Image makes a formatted image for spec without mounting it, for a test
// that puts something between the image and its mount (a device-mapper
// table); in the kernel guest it copies the template. Specs with Setup
// commands need a mount and are refused.
func Image(t testing.TB, run Run, spec Spec) string {
	t.Helper()
	if len(spec.Setup) > 0 {
		t.Fatalf("testfs.Image: %s has setup commands, which need a mount: use FileSystem", spec.Key())
	}
	if testutil.InGuest() {
		return fromTemplate(t, spec)
	}
	img := NewImage(t, spec.Size)
	if err := mkfs(run, spec, img); err != nil {
		t.Fatal(err)
	}
	return img
}

func mkfs(run Run, spec Spec, img string) error {
	if err := run("mkfs."+spec.FSType, append(append([]string{"-q"}, spec.MkfsArgs...), img)...); err != nil {
		return fmt.Errorf("mkfs.%s: %w", spec.FSType, err)
	}
	return nil
}

func runSetup(run Run, spec Spec, mnt string) error {
	for _, cmd := range spec.Setup {
		args := append(append([]string{}, cmd[1:]...), mnt)
		if err := run(cmd[0], args...); err != nil {
			return fmt.Errorf("%v: %w", cmd, err)
		}
	}
	return nil
}

// MakeTemplate makes the image FileSystem would make for spec, as
// dir/<spec.Key()>.img, for a guest without mkfs. The setup commands run
// with it mounted on a scratch directory, unmounted before it returns.
func MakeTemplate(t testing.TB, run Run, dir string, spec Spec) {
	t.Helper()
	img := filepath.Join(dir, spec.Key()+".img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(spec.Size)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := mkfs(run, spec, img); err != nil {
		t.Fatal(err)
	}
	if len(spec.Setup) == 0 {
		return
	}
	dev, err := loop.Attach(img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := loop.Detach(dev); err != nil {
			t.Errorf("detaching %s: %v", dev.Path(), err)
		}
	}()
	mnt := t.TempDir()
	if err := unix.Mount(dev.Path(), mnt, spec.FSType, 0, ""); err != nil {
		t.Fatalf("mounting the %s template: %v", spec.Key(), err)
	}
	err = runSetup(run, spec, mnt)
	if uerr := unix.Unmount(mnt, 0); uerr != nil {
		t.Fatalf("unmounting the %s template: %v", spec.Key(), uerr)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// fromTemplate copies the template for spec into a fresh image, keeping
// its holes (SEEK_DATA/SEEK_HOLE and copy_file_range), and returns its path.
func fromTemplate(t testing.TB, spec Spec) string {
	t.Helper()
	dir := os.Getenv(TemplatesEnv)
	if dir == "" {
		t.Fatalf("%s is set but %s is not: the guest has no mkfs", testutil.GuestEnv, TemplatesEnv)
	}
	src, err := os.Open(filepath.Join(dir, spec.Key()+".img"))
	if err != nil {
		t.Fatalf("no template image for %+v (%v): add the Spec to the kernel harness's list (test/kernel)", spec, err)
	}
	defer src.Close()
	img := NewImage(t, spec.Size)
	dst, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	for off := int64(0); off < spec.Size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		for r, w := data, data; r < hole; {
			n, err := unix.CopyFileRange(sfd, &r, dfd, &w, int(hole-r), 0)
			if err != nil || n == 0 {
				t.Fatalf("copying the %s template: %d, %v", spec.Key(), n, err)
			}
		}
		off = hole
	}
	return img
}
