package xfs

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
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

// repair runs xfs_repair -n (no modify) and fails the test on any
// finding: exit status 0 is a clean file system.
func repair(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command("xfs_repair", "-n", "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("xfs_repair -n %s: %v\n%s", path, err, out)
	}
}

// unstable are xfs_db's lines that differ between any two file systems:
// the UUID, checksums, times, the primary's uuid-derived fields.
var unstable = regexp.MustCompile(`(?m)^(uuid|crc|v3\.crc|v3\.uuid|.*time\..*|v3\.change_count) = .*\n`)

// dbPrint is what xfs_db prints of the structures cmds select, less the
// unstable lines.
func dbPrint(t *testing.T, path string, cmds ...string) string {
	t.Helper()
	args := []string{"-r"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("xfs_db", append(args, "-c", "print", path)...).CombinedOutput()
	if err != nil {
		t.Fatalf("xfs_db %v %s: %v\n%s", cmds, path, err, out)
	}
	return unstable.ReplaceAllString(string(out), "")
}

// TestFormatIsMkfs formats sizes across the layout's cases and holds every
// structure made, field by field, to what mkfs.xfs makes of the same size
// with the package's options: the primary superblock, each group's AGF,
// AGI and AGFL, the three btree roots, the first four inodes. Then
// xfs_repair -n must find it clean.
func TestFormatIsMkfs(t *testing.T) {
	if !testutil.HaveTools(t, "mkfs.xfs, xfs_db and xfs_repair") {
		return
	}
	dir := t.TempDir()
	for _, size := range []int64{MinSize, 1<<30 + 12<<10, 10 << 30, 5 << 40} {
		t.Run(fmt.Sprint(size>>20, "MiB"), func(t *testing.T) {
			ours, info := image(t, dir, size, Options{})
			defer os.Remove(ours)
			ref := filepath.Join(dir, "mkfs.img")
			defer os.Remove(ref)
			if err := os.WriteFile(ref, nil, 0o600); err != nil || os.Truncate(ref, size) != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("mkfs.xfs", "-q", "-f", "-s", "size=4096",
				"-m", "crc=1,finobt=0,reflink=0,rmapbt=0,bigtime=1,inobtcount=0",
				"-i", "sparse=0,nrext64=0", "-n", "ftype=1", ref).CombinedOutput()
			if err != nil {
				t.Fatalf("mkfs.xfs: %v\n%s", err, out)
			}
			what := [][]string{{"sb 0"}}
			for a := uint32(0); a < info.AGCount; a++ {
				what = append(what, []string{fmt.Sprint("agf ", a)}, []string{fmt.Sprint("agi ", a)}, []string{fmt.Sprint("agfl ", a)},
					[]string{fmt.Sprint("agf ", a), "addr bnoroot"}, []string{fmt.Sprint("agf ", a), "addr cntroot"},
					[]string{fmt.Sprint("agi ", a), "addr root"})
			}
			for ino := 96; ino < 100; ino++ {
				what = append(what, []string{fmt.Sprint("inode ", ino)})
			}
			for _, cmds := range what {
				got, want := dbPrint(t, ours, cmds...), dbPrint(t, ref, cmds...)
				if got != want {
					t.Errorf("%v differs from mkfs.xfs's:\nours:\n%s\nmkfs.xfs:\n%s", cmds, got, want)
				}
			}
			repair(t, ours)
			var st unix.Stat_t
			if err := unix.Stat(ours, &st); err != nil {
				t.Fatal(err)
			}
			// Metadata only: seven blocks a group, the inode chunk and the
			// log's first block (and what the pool's file system rounds
			// a sparse file's allocation to).
			if used, bound := st.Blocks*512, int64(info.AGCount)*7*BlockSize+(chunkBlks+1)*BlockSize+64<<10; used > bound {
				t.Fatalf("%d bytes written, want at most %d", used, bound)
			}
			t.Logf("%d groups of %d blocks, log %d blocks: %d KiB written", info.AGCount, info.AGBlocks, info.LogBlocks, st.Blocks/2)
		})
	}
}

// TestFormatRefusesSizes: too small and too large.
func TestFormatRefusesSizes(t *testing.T) {
	dir := t.TempDir()
	for _, size := range []int64{0, 16 << 20, MinSize - 1} {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(size)))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(size)
		if _, err := Format(f, Options{}); !errors.Is(err, ErrSize) {
			t.Errorf("%d bytes: %v, want ErrSize", size, err)
		}
		f.Close()
	}
}

// TestFormatErasesWhatWasThere: a file that held data formats to the
// same clean file system as an empty one (the range is punched first).
func TestFormatErasesWhatWasThere(t *testing.T) {
	if !testutil.HaveTools(t, "xfs_repair") {
		return
	}
	path := filepath.Join(t.TempDir(), "old.img")
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xa5}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(MinSize); err != nil {
		t.Fatal(err)
	}
	if _, err := Format(f, Options{}); err != nil {
		t.Fatal(err)
	}
	repair(t, path)
}

// TestKernelMountsWritesAndGrows: the kernel mounts the file system on a
// loop device of 4 KiB blocks, as an image volume's, takes files, keeps
// them across a remount, and grows online (XFS_IOC_FSGROWFSDATA) into a
// larger device; statfs counts what Format said is free, each UUID is its
// own, and xfs_repair finds it clean after.
func TestKernelMountsWritesAndGrows(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	path, info := image(t, dir, 1<<30, Options{RootMode: 0o777})
	_, other := image(t, dir, MinSize, Options{})
	if info.UUID == other.UUID {
		t.Fatal("two file systems got one UUID")
	}
	dev, err := loop.Attach(path, loop.Options{BlockSize: 4096, DirectIO: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(dev) })
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	t.Cleanup(func() { testutil.UnmountUnder(t, mnt) })
	mount := func() {
		t.Helper()
		if err := unix.Mount(dev.Path(), mnt, "xfs", 0, ""); err != nil {
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
	if sfs.Bsize != BlockSize || sfs.Type != unix.XFS_SUPER_MAGIC {
		t.Fatalf("statfs: type %#x, block size %d", sfs.Type, sfs.Bsize)
	}
	// The kernel holds back its reserve pool (8192 blocks at most) and
	// XFS_ALLOC_SET_ASIDE from what the superblock says is free.
	if sfs.Bfree > info.FreeBlocks || sfs.Bfree < info.FreeBlocks-8192-64 {
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
	// Online growth: the image, its device, then the file system.
	if err := os.Truncate(path, 3<<30+40<<10); err != nil {
		t.Fatal(err)
	}
	if err := loop.Resize(dev); err != nil {
		t.Fatal(err)
	}
	devBytes, err := loop.Size(dev.Path())
	if err != nil {
		t.Fatal(err)
	}
	want := GrowTarget(info.AGBlocks, uint64(devBytes)/BlockSize)
	if err := fsops.GrowXFS(mnt, want); err != nil {
		t.Fatalf("growing: %v", err)
	}
	if err := unix.Statfs(mnt, &sfs); err != nil || sfs.Blocks < 3*(1<<30)/BlockSize*95/100 {
		t.Fatalf("statfs after growing: %d blocks (%v)", sfs.Blocks, err)
	}
	// Growing to what it has is no change.
	if err := fsops.GrowXFS(mnt, want); err != nil {
		t.Fatalf("growing to its own size: %v", err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	// The grown superblock is on the device once unmounted.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	size, err := ReadSize(f)
	f.Close()
	if err != nil || size.Blocks != want || size.AGBlocks != info.AGBlocks {
		t.Fatalf("after growing: %+v (%v), want %d blocks", size, err, want)
	}
	if testutil.HaveTools(t, "xfs_repair") {
		repair(t, path)
	}
}

// TestReadSize: the superblock's extent, and ErrNotXFS for anything else.
func TestReadSize(t *testing.T) {
	dir := t.TempDir()
	path, info := image(t, dir, 2<<30, Options{})
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := ReadSize(f)
	if err != nil || s.Blocks != info.Blocks || s.BlockSize != BlockSize || s.Bytes() != 2<<30 || s.AGBlocks != info.AGBlocks {
		t.Fatalf("ReadSize: %+v, %v; want %d blocks", s, err, info.Blocks)
	}
	if _, err := ReadSize(strings.NewReader(strings.Repeat("\x00", 4096))); !errors.Is(err, ErrNotXFS) {
		t.Fatalf("zeros: %v, want ErrNotXFS", err)
	}
}
