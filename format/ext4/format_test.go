package ext4

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// image makes a sparse file of size bytes and formats it.
func image(t *testing.T, dir string, size int64, opt Options) (string, Info) {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("fs-%d.img", size))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	info, err := Format(f, opt)
	if err != nil {
		t.Fatalf("formatting %d bytes: %v", size, err)
	}
	return path, info
}

// fsck runs e2fsck -fn (read-only, forced) and fails the test on any
// finding: exit status 0 is a clean file system.
func fsck(t *testing.T, path string) {
	t.Helper()
	if !testutil.HaveTools(t, "e2fsck") {
		return
	}
	out, err := exec.Command("e2fsck", "-fn", path).CombinedOutput()
	if err != nil {
		t.Fatalf("e2fsck -fn %s: %v\n%s", path, err, out)
	}
}

// superblockField reads one field of dumpe2fs -h.
func superblockField(t *testing.T, path, field string) string {
	t.Helper()
	out, err := exec.Command("dumpe2fs", "-h", path).CombinedOutput()
	if err != nil {
		t.Fatalf("dumpe2fs -h %s: %v\n%s", path, err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == field {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("dumpe2fs -h %s shows no %q", path, field)
	return ""
}

// TestFormatIsClean formats sizes that exercise the layout's cases (one
// group, a short last group left out, many groups, a journal across
// groups, one with an extent leaf) and has e2fsck check each.
func TestFormatIsClean(t *testing.T) {
	if !testutil.HaveTools(t, "e2fsck") {
		return
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		size    int64
		journal uint32
		groups  uint32
	}{
		{"smallest", MinSize, 1024, 1},
		{"one group and a bit", 128<<20 + 40<<10, 4096, 1},
		{"1 GiB", 1 << 30, 8192, 8},
		{"10 GiB", 10 << 30, 16384, 80},
		{"20 GiB, journal across groups", 20 << 30, 32768, 160},
		{"100 GiB, journal in a leaf", 100 << 30, 131072, 800},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, info := image(t, dir, tc.size, Options{})
			defer os.Remove(path)
			if info.JournalBlocks != tc.journal || info.Groups != tc.groups {
				t.Fatalf("journal %d blocks in %d groups, want %d in %d", info.JournalBlocks, info.Groups, tc.journal, tc.groups)
			}
			fsck(t, path)
			if got := superblockField(t, path, "Filesystem features"); !strings.Contains(got, "has_journal") || !strings.Contains(got, "extent") {
				t.Fatalf("features %q lack has_journal or extent", got)
			}
			if got, want := superblockField(t, path, "Free blocks"), fmt.Sprint(info.FreeBlocks); got != want {
				t.Fatalf("free blocks %s, Format said %s", got, want)
			}
			// Metadata only: two bitmap blocks a group, the superblock
			// copies and a few blocks more; never the inode tables or the
			// journal.
			var st unix.Stat_t
			if err := unix.Stat(path, &st); err != nil {
				t.Fatal(err)
			}
			if used, bound := st.Blocks*512, int64(info.Groups)*2*blockSize+1<<20; used > bound {
				t.Fatalf("%d bytes of %s written, want at most %d", used, path, bound)
			}
			t.Logf("%d groups, %d inodes, journal %d blocks: %d KiB written", info.Groups, info.Inodes, info.JournalBlocks, st.Blocks/2)
		})
	}
}

// TestFormatRefusesSizes: too small, too large, and a label too long.
func TestFormatRefusesSizes(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int64{0, 4 << 20, MinSize - 1} {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(size)))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		if _, err := Format(f, Options{}); err == nil || !strings.Contains(err.Error(), "size not supported") {
			t.Errorf("%d bytes: %v, want a size refusal", size, err)
		}
		f.Close()
	}
	if _, err := newGeometry(MaxSize + 1); err == nil {
		t.Error("a size past 16 TiB was taken")
	}
	f, _ := os.Create(filepath.Join(dir, "label"))
	defer f.Close()
	f.Truncate(MinSize)
	if _, err := Format(f, Options{Label: strings.Repeat("x", 17)}); err == nil {
		t.Error("a 17-byte label was taken")
	}
}

// TestUUIDs: every file system gets its own UUID unless one is given, and
// the one given is the one made.
func TestUUIDs(t *testing.T) {
	dir := t.TempDir()
	seen := map[[16]byte]bool{}
	for i := 0; i < 3; i++ {
		path, info := image(t, dir, MinSize+int64(i)<<20, Options{})
		os.Remove(path)
		if seen[info.UUID] || info.UUID == ([16]byte{}) {
			t.Fatalf("UUID %x repeated or zero", info.UUID)
		}
		seen[info.UUID] = true
	}
	want := [16]byte{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x4d, 0xef, 0x81, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef}
	path, _ := image(t, dir, 64<<20, Options{UUID: want, Label: "vol-1"})
	if !testutil.HaveTools(t, "dumpe2fs") {
		return
	}
	if got := superblockField(t, path, "Filesystem UUID"); got != "12345678-9abc-4def-8123-456789abcdef" {
		t.Fatalf("UUID %s, want the one given", got)
	}
	if got := superblockField(t, path, "Filesystem volume name"); got != "vol-1" {
		t.Fatalf("label %q, want vol-1", got)
	}
}

// TestFormatErasesWhatWasThere: an image that held data (a previous file
// system) is formatted clean: Format punches it to zeros first.
func TestFormatErasesWhatWasThere(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "reused.img")
	junk := bytes.Repeat([]byte{0xA5}, 64<<20)
	if err := os.WriteFile(path, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Format(f, Options{}); err != nil {
		t.Fatal(err)
	}
	fsck(t, path)
}

// TestKernelMountsAndWrites: the kernel mounts the file system read-write
// through a loop device, files written there survive an unmount and a
// second mount, and e2fsck finds it clean after; the free space statfs
// reports is what Format counted; the root directory has the mode asked.
func TestKernelMountsAndWrites(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	path, info := image(t, dir, 1<<30, Options{RootMode: 0o777})
	dev, err := loop.Attach(path, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Detach(dev)
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	t.Cleanup(func() { testutil.UnmountUnder(t, mnt) })
	mount := func() {
		t.Helper()
		if err := unix.Mount(dev.Path(), mnt, "ext4", 0, ""); err != nil {
			t.Fatalf("mounting %s: %v", dev.Path(), err)
		}
	}
	mount()
	if st, err := os.Stat(mnt); err != nil || st.Mode().Perm() != 0o777 {
		t.Fatalf("root directory: %v (%v), want the RootMode asked for, 0777", st.Mode(), err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(mnt, &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Bsize != blockSize || sfs.Blocks == 0 {
		t.Fatalf("statfs: block size %d, %d blocks", sfs.Bsize, sfs.Blocks)
	}
	// The kernel counts free blocks from the descriptors it was given.
	if sfs.Bfree != info.FreeBlocks {
		t.Fatalf("statfs free blocks %d, Format counted %d", sfs.Bfree, info.FreeBlocks)
	}
	data := bytes.Repeat([]byte("point in time "), 1<<16)
	sum := sha256.Sum256(data)
	for i := 0; i < 50; i++ {
		sub := filepath.Join(mnt, fmt.Sprintf("d%d", i%5))
		os.MkdirAll(sub, 0o755)
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	mount()
	for i := 0; i < 50; i++ {
		b, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf("d%d", i%5), fmt.Sprintf("f%d", i)))
		if err != nil || sha256.Sum256(b) != sum {
			t.Fatalf("file %d after a remount: %v", i, err)
		}
	}
	if _, err := os.Stat(filepath.Join(mnt, "lost+found")); err != nil {
		t.Fatalf("lost+found: %v", err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	fsck(t, path)
}

// TestFormatEdgeSizes: a size that is not a whole number of blocks, and
// the sizes around where a short last group stops being left out.
func TestFormatEdgeSizes(t *testing.T) {
	if !testutil.HaveTools(t, "e2fsck") {
		return
	}
	dir := t.TempDir()
	base := int64(4 * blocksPerGroup * blockSize) // four whole groups
	// The shortest fifth group kept: its metadata and 50 blocks (its
	// inode table shrinks with the size, so search for it).
	keep := int64(1)
	for ; keep < blocksPerGroup; keep++ {
		g, err := newGeometry(base + keep*blockSize)
		if err != nil {
			t.Fatal(err)
		}
		if g.groups == 5 {
			if keep != int64(g.overhead(4))+50 {
				t.Fatalf("a fifth group of %d blocks was kept; its metadata takes %d", keep, g.overhead(4))
			}
			break
		}
	}
	for _, tc := range []struct {
		size   int64
		groups uint32
	}{
		{1<<30 + 1000, 8},
		{base + (keep-1)*blockSize, 4},
		{base + keep*blockSize, 5},
		{base + (keep+1)*blockSize + 123, 5},
	} {
		path, info := image(t, dir, tc.size, Options{})
		if info.Groups != tc.groups {
			t.Errorf("%d bytes: %d groups, want %d", tc.size, info.Groups, tc.groups)
		}
		fsck(t, path)
		os.Remove(path)
	}
}

// TestReadSize reads back what Format wrote, and refuses what is not an
// ext4 (zeros) or too short to hold a superblock.
func TestReadSize(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int64{MinSize, 1 << 30, 10<<30 + 12345} {
		path, info := image(t, dir, size, Options{})
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ReadSize(f)
		f.Close()
		if err != nil || got.Blocks != info.Blocks || got.BlockSize != 4096 || got.Bytes() != int64(info.Blocks)*4096 {
			t.Fatalf("size %d: ReadSize %+v, %v; Format made %d blocks", size, got, err, info.Blocks)
		}
	}
	for _, tc := range []struct {
		name string
		size int64
		want error
	}{{"zeros", 1 << 20, ErrNotExt4}, {"shorter than a superblock", 1000, io.EOF}} {
		f, err := os.Create(filepath.Join(dir, tc.name))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(tc.size)
		_, err = ReadSize(f)
		f.Close()
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
