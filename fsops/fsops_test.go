package fsops

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestWriteFileAtomic: the durable replacement and the staged one both
// leave the last content, the mode asked for, and no temporary file; an
// aborted stage leaves the old content.
func TestWriteFileAtomic(t *testing.T) {
	staged := func(p string, data []byte, perm os.FileMode) error {
		s, err := StageFile(p, data, perm)
		if err != nil {
			return err
		}
		f, err := s.Place()
		if err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		return f.Close()
	}
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"WriteFileAtomic": WriteFileAtomic, "StageFile": staged} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "state.json")
			for _, content := range []string{"one", "two, longer", "3"} {
				if err := write(p, []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(p)
				if err != nil || string(got) != content {
					t.Fatalf("got %q, %v; want %q", got, err, content)
				}
			}
			s, err := StageFile(p, []byte("never"), 0o600)
			if err != nil {
				t.Fatal(err)
			}
			s.Abort()
			if got, _ := os.ReadFile(p); string(got) != "3" {
				t.Fatalf("an aborted stage changed the file: %q", got)
			}
			st, err := os.Stat(p)
			if err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v, %v", st.Mode(), err)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Fatalf("temporary files left: %v", entries)
			}
		})
	}
}

// TestHoldsNoData: a file whose extents are all holes or fallocated and
// unwritten holds no data; one written to, even with zeros, does.
func TestHoldsNoData(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		make func(p string) error
		want bool
	}{
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o600) }, true},
		{"sparse", func(p string) error { return os.Truncate(p, 1<<20) }, true},
		{"allocated", func(p string) error { return CreateBackingFile(p, 1<<20) }, true},
		{"written zeros", func(p string) error { return os.WriteFile(p, make([]byte, 8192), 0o600) }, false},
		{"allocated, one block written", func(p string) error {
			if err := CreateBackingFile(p, 1<<20); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("x"), 512<<10)
			return err
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			if c.name == "sparse" {
				os.WriteFile(p, nil, 0o600)
			}
			if err := c.make(p); err != nil {
				t.Fatal(err)
			}
			got, err := HoldsNoData(p)
			if err != nil || got != c.want {
				t.Fatalf("HoldsNoData = %v, %v; want %v", got, err, c.want)
			}
		})
	}
}

func TestParseMountOptions(t *testing.T) {
	tests := []struct {
		in   []string
		want uintptr
		ok   bool
	}{
		{nil, 0, true},
		{[]string{"ro"}, unix.MS_RDONLY, true},
		{[]string{"nosuid,nodev", "noexec"}, unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, true},
		{[]string{"rw", "defaults"}, 0, true},
		{[]string{"data=ordered"}, 0, false},
		{[]string{"uid=1000"}, 0, false},
	}
	for _, tc := range tests {
		got, err := ParseMountOptions(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("ParseMountOptions(%q) = %x, %v", tc.in, got, err)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) {
			t.Errorf("error does not unwrap to EINVAL: %v", err)
		}
	}
}

func TestBindMount(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	src, dst, link := filepath.Join(base, "src"), filepath.Join(base, "dst"), filepath.Join(base, "link")
	os.Mkdir(src, 0o755)
	os.Mkdir(dst, 0o755)
	os.Symlink(dst, link)
	t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })

	if err := BindMount(src, link, 0); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("mounting on a symlink: %v, want ELOOP", err)
	}
	if mp, err := GetMountPoint(dst); err != nil || mp != nil {
		t.Fatalf("not mounted yet: %v %v", mp, err)
	}
	if err := BindMount(src, dst, unix.MS_RDONLY|unix.MS_NOEXEC); err != nil {
		t.Fatal(err)
	}
	mp, err := GetMountPoint(dst)
	if err != nil || mp == nil {
		t.Fatalf("%v %v", mp, err)
	}
	dev, ino, _, _ := Identity(src)
	if !mp.ReadOnly || !mp.HasOption("noexec") || mp.Dev != dev || mp.Ino != ino {
		t.Fatalf("mount point %+v, want ro,noexec showing %d:%d", mp, dev, ino)
	}
	if err := os.WriteFile(filepath.Join(dst, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("write: %v", err)
	}
	if err := Unmount(dst); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(dst); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("second unmount: %v, want EINVAL", err)
	}
}

func TestRemoveAllDoesNotFollowSymlinks(t *testing.T) {
	testutil.RequireRoot(t) // removes a 0500 directory's entries, as the driver (root) does
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "precious"), []byte("x"), 0o644)
	vol := filepath.Join(base, "vol")
	os.MkdirAll(filepath.Join(vol, "a", "b"), 0o755)
	os.Symlink(outside, filepath.Join(vol, "a", "escape"))
	os.WriteFile(filepath.Join(vol, "a", "b", "f"), nil, 0o644)
	os.Chmod(filepath.Join(vol, "a", "b"), 0o500)
	if err := RemoveAll(vol); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(vol); !os.IsNotExist(err) {
		t.Fatal("volume not removed")
	}
	if _, err := os.Stat(filepath.Join(outside, "precious")); err != nil {
		t.Fatal("RemoveAll followed a symlink out of the tree")
	}
	if err := RemoveAll(vol); err != nil {
		t.Fatalf("missing path: %v", err)
	}
}

func TestTreeUsage(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), bytes.Repeat([]byte("x"), 1<<20), 0o644)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "hard"))
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.Symlink("/etc", filepath.Join(dir, "d", "etc"))
	u, err := TreeUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.Inodes != 4 { // dir, a (hard link counted once), d, symlink
		t.Fatalf("inodes %d, want 4", u.Inodes)
	}
	if u.Bytes < 1<<20 || u.Bytes > 2<<20 {
		t.Fatalf("bytes %d, want about 1 MiB (hard link once, /etc not followed)", u.Bytes)
	}
}

func TestCreateAndGrowBackingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := CreateBackingFile(p, 3<<20+512); err != nil {
		t.Fatal(err)
	}
	if err := CreateBackingFile(p, 1<<20); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second create: %v", err)
	}
	if err := GrowFile(p, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := GrowFile(p, 1<<20); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("shrink: %v", err)
	}
	var st unix.Stat_t
	unix.Stat(p, &st)
	if st.Size != 8<<20 {
		t.Fatalf("size %d", st.Size)
	}
	if allocated := st.Blocks * 512; allocated < 8<<20 {
		t.Fatalf("%d bytes allocated, want all 8 MiB reserved", allocated)
	}
}

// TestGrowSparse: the file grows to the size asked with nothing of it
// allocated, and never shrinks.
func TestGrowSparse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := GrowSparse(p, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := GrowSparse(p, 1<<20); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("shrink: %v", err)
	}
	var st unix.Stat_t
	unix.Stat(p, &st)
	if st.Size != 64<<20 || st.Blocks*512 > 1<<20 {
		t.Fatalf("size %d, %d bytes allocated; want 64 MiB, sparse", st.Size, st.Blocks*512)
	}
}

func TestCopyFileDataKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	data := bytes.Repeat([]byte("data"), 256<<10) // 1 MiB
	f.WriteAt(data, 0)
	f.WriteAt(data, 64<<20) // 64 MiB hole between
	f.Close()
	in, _ := os.Open(src)
	defer in.Close()
	fi, _ := in.Stat()
	out, _ := os.Create(filepath.Join(dir, "dst"))
	defer out.Close()
	var pr Progress
	m, err := CopyFileData(WithProgress(context.Background(), &pr), int(out.Fd()), int(in.Fd()), fi.Size(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Progress counts the data moved: both 1 MiB extents, no hole (or,
	// reflinked, the whole size at once).
	if b, _ := pr.Done(); m != CopyReflink && b != 2<<20 || m == CopyReflink && b != fi.Size() {
		t.Fatalf("progress counted %d bytes (method %v)", b, m)
	}
	var st unix.Stat_t
	unix.Fstat(int(out.Fd()), &st)
	if st.Size != fi.Size() || st.Blocks*512 > 8<<20 {
		t.Fatalf("copy has size %d and %d bytes allocated; want %d and about 2 MiB", st.Size, st.Blocks*512, fi.Size())
	}
	got, _ := os.ReadFile(out.Name())
	want, _ := os.ReadFile(src)
	if !bytes.Equal(got, want) {
		t.Fatal("content differs")
	}
}

func TestCopyTree(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "deep", "f"), []byte("hello"), 0o640)
	os.WriteFile(filepath.Join(src, "setuid"), []byte("x"), 0o644)
	os.Chown(filepath.Join(src, "setuid"), 1234, 5678)
	unix.Chmod(filepath.Join(src, "setuid"), 0o4755) // after chown, which clears setuid
	os.Link(filepath.Join(src, "setuid"), filepath.Join(src, "hardlink"))
	os.Symlink("/etc/passwd", filepath.Join(src, "abs-link"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o600)
	unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	unix.Chmod(filepath.Join(src, "sub"), 0o1777)
	unix.Setxattr(filepath.Join(src, "setuid"), "user.test", []byte("value"), 0)
	mtime := unix.NsecToTimespec(1_600_000_000_123_456_789)
	unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(src, "sub"), []unix.Timespec{mtime, mtime}, 0)
	os.Mkdir(dst, 0o755)

	var pr Progress
	stats, err := CopyTree(WithProgress(context.Background(), &pr), src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Files != 2 || stats.Hardlinks != 1 || stats.Symlinks != 1 || stats.Special != 2 || stats.Dirs != 2 {
		t.Fatalf("stats %+v", stats)
	}
	if b, f := pr.Done(); b != stats.Bytes || f != stats.Files {
		t.Fatalf("progress counted %d bytes, %d files; stats %+v", b, f, stats)
	}
	var a, b unix.Stat_t
	unix.Lstat(filepath.Join(dst, "setuid"), &a)
	unix.Lstat(filepath.Join(dst, "hardlink"), &b)
	if a.Mode&0o7777 != 0o4755 || a.Uid != 1234 || a.Gid != 5678 || a.Ino != b.Ino {
		t.Fatalf("setuid file: mode %o uid %d gid %d, hard link shares inode: %v", a.Mode&0o7777, a.Uid, a.Gid, a.Ino == b.Ino)
	}
	if target, _ := os.Readlink(filepath.Join(dst, "abs-link")); target != "/etc/passwd" {
		t.Fatalf("symlink target %q", target)
	}
	buf := make([]byte, 16)
	if n, _ := unix.Getxattr(filepath.Join(dst, "setuid"), "user.test", buf); string(buf[:n]) != "value" {
		t.Fatal("xattr lost")
	}
	var s unix.Stat_t
	unix.Lstat(filepath.Join(dst, "sub"), &s)
	if s.Mode&0o7777 != 0o1777 || s.Mtim != mtime {
		t.Fatalf("dir: mode %o mtime %v want %v", s.Mode&0o7777, s.Mtim, mtime)
	}
	unix.Lstat(filepath.Join(dst, "null"), &s)
	if s.Mode&unix.S_IFMT != unix.S_IFCHR || s.Rdev != unix.Mkdev(1, 3) {
		t.Fatal("device node not copied")
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "sub", "deep", "f")); string(b) != "hello" {
		t.Fatal("content")
	}
}

// TestCopyTreeRefusesSwappedRoot: a source that is a symlink is refused.
func TestCopyTreeRefusesSymlinkRoot(t *testing.T) {
	base := t.TempDir()
	os.Symlink("/etc", filepath.Join(base, "src"))
	os.Mkdir(filepath.Join(base, "dst"), 0o755)
	if _, err := CopyTree(context.Background(), filepath.Join(base, "src"), filepath.Join(base, "dst")); !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
		t.Fatalf("copy from a symlink root: %v", err)
	}
}

// TestCopyKeepsCapabilities: security.capability survives the copy of a
// file owned by someone else (chown would clear it if done after).
func TestCopyKeepsCapabilities(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	os.Mkdir(src, 0o755)
	os.Mkdir(dst, 0o755)
	f := filepath.Join(src, "ping")
	os.WriteFile(f, []byte("binary"), 0o755)
	os.Chown(f, 1000, 1000)
	// VFS_CAP_REVISION_2, cap_net_raw permitted+effective.
	capv := []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := unix.Setxattr(f, "security.capability", capv, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := CopyTree(context.Background(), src, dst); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64)
	n, err := unix.Getxattr(filepath.Join(dst, "ping"), "security.capability", got)
	if err != nil || !bytes.Equal(got[:n], capv) {
		t.Fatalf("capability lost in the copy: %v", err)
	}
}
