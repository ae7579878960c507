package ext4

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// kernelFS mounts the file system in image through a loop device for the
// length of fn, and detaches it after.
func kernelFS(t *testing.T, image string, fn func(mnt string)) {
	t.Helper()
	mountFS(t, image, 0, fn)
}

// mountFS is kernelFS with mount flags.
func mountFS(t *testing.T, image string, flags uintptr, fn func(mnt string)) {
	t.Helper()
	dev, err := loop.Attach(image, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Detach(dev)
	mnt := image + ".mnt"
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(mnt)
	if err := unix.Mount(dev.Path(), mnt, "ext4", flags, ""); err != nil {
		t.Fatalf("mounting %s (%s): %v", image, dev.Path(), err)
	}
	defer func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			testutil.UnmountUnder(t, mnt)
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	}()
	fn(mnt)
}

// someFiles writes n files of different sizes at mnt and returns their
// sums by name.
func someFiles(t *testing.T, mnt string, n int) map[string][sha256.Size]byte {
	t.Helper()
	sums := map[string][sha256.Size]byte{}
	for i := 0; i < n; i++ {
		data := bytes.Repeat([]byte(fmt.Sprintf("file %d before the growth ", i)), 1000*(i+1))
		name := fmt.Sprintf("f%d", i)
		if err := os.WriteFile(filepath.Join(mnt, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		sums[name] = sha256.Sum256(data)
	}
	return sums
}

// checkFiles reads back what someFiles wrote.
func checkFiles(t *testing.T, mnt string, sums map[string][sha256.Size]byte) {
	t.Helper()
	for name, sum := range sums {
		b, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || sha256.Sum256(b) != sum {
			t.Fatalf("%s after the growth: %v (sum differs: %v)", name, err, err == nil)
		}
	}
}

// growImage sets image's size and grows its file system.
func growImage(t *testing.T, image string, size int64) (Size, error) {
	t.Helper()
	f, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return Grow(f)
}

// TestGrowIsClean grows file systems Format made, with files written by
// the kernel in them, in the cases the layout has (a short last group
// widened, whole groups added, superblock copies among the new groups,
// several descriptor blocks, a new short last group, one left out), and
// checks each: e2fsck finds it clean, the kernel mounts it at the new
// size, the files are intact, and the new space takes a file that needs it.
func TestGrowIsClean(t *testing.T) {
	testutil.RequireRoot(t)
	if !testutil.HaveTools(t, "e2fsck") {
		return
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		from, to int64
	}{
		{"smallest to 1 GiB", MinSize, 1 << 30},
		{"short group widened only", MinSize, 100 << 20},
		{"short group widened to whole", 100 << 20, 128 << 20},
		{"whole groups added", 1 << 30, 3 << 30},
		{"to the last group one descriptor block maps", MinSize, 16 << 30},
		{"a new short last group", 256 << 20, 1<<30 + 50<<20 + 12345},
		{"two descriptor blocks", 20 << 30, 30 << 30},
		{"past what one descriptor block maps: up to it", MinSize, 16<<30 + 256<<20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, info := image(t, dir, tc.from, Options{})
			defer os.Remove(path)
			var sums map[string][sha256.Size]byte
			kernelFS(t, path, func(mnt string) { sums = someFiles(t, mnt, 5) })
			got, err := growImage(t, path, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			if got.Blocks <= info.Blocks || got.Bytes() > tc.to {
				t.Fatalf("grown from %d to %d blocks in %d bytes", info.Blocks, got.Blocks, tc.to)
			}
			want, _ := Blocks(tc.to)
			if reach := uint64(info.Groups+127) / 128 * 128 * blocksPerGroup; want > reach {
				want = reach // as far as its descriptor blocks map
			}
			if got.Blocks > want || want-got.Blocks > blocksPerGroup/8 {
				t.Fatalf("grown to %d blocks; a file system made at %d bytes has %d", got.Blocks, tc.to, want)
			}
			f, _ := os.Open(path)
			target, err := GrowTarget(f, tc.to)
			f.Close()
			if beyond := want < func() uint64 { b, _ := Blocks(tc.to); return b }(); beyond != errors.Is(err, ErrSize) || (!beyond && target != got.Blocks) {
				t.Fatalf("GrowTarget: %d, %v; Grow made %d blocks", target, err, got.Blocks)
			}
			fsck(t, path)
			if b := superblockField(t, path, "Block count"); b != strconv.FormatUint(got.Blocks, 10) {
				t.Fatalf("dumpe2fs says %s blocks, Grow %d", b, got.Blocks)
			}
			kernelFS(t, path, func(mnt string) {
				checkFiles(t, mnt, sums)
				var st unix.Statfs_t
				if err := unix.Statfs(mnt, &st); err != nil {
					t.Fatal(err)
				}
				if st.Blocks*uint64(st.Bsize) <= uint64(tc.from) {
					t.Fatalf("mounted at %d blocks after a growth from %d bytes", st.Blocks, tc.from)
				}
				// More than the old file system held: it lands in the
				// new groups.
				f, err := os.Create(filepath.Join(mnt, "big"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(st.Bfree-st.Bfree/8)*int64(st.Bsize)); err != nil {
					t.Fatalf("allocating most of the %d free blocks: %v", st.Bfree, err)
				}
			})
			fsck(t, path)
			// Again: nothing to add, nothing written.
			var before, after unix.Stat_t
			unix.Stat(path, &before)
			f, err = os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			again, err := Grow(f)
			f.Close()
			if err != nil || again != got {
				t.Fatalf("a second growth: %+v, %v; want %+v and nothing done", again, err, got)
			}
			if unix.Stat(path, &after); after.Mtim != before.Mtim {
				t.Fatal("a growth with nothing to add wrote")
			}
		})
	}
}

// TestGrowRefuses: what Grow leaves to the kernel, each with its reason.
func TestGrowRefuses(t *testing.T) {
	dir := t.TempDir()
	setBit := func(path string, off int64, bit byte) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, 1)
		f.ReadAt(b, off)
		b[0] |= bit
		f.WriteAt(b, off)
	}
	for _, tc := range []struct {
		name string
		make func(path string)
		to   int64
		want error
	}{
		{"not ext4", func(path string) { os.WriteFile(path, make([]byte, 1<<20), 0o600) }, 64 << 20, ErrNotExt4},
		{"journal to replay", func(path string) {
			image(t, dir, 32<<20, Options{})
			os.Rename(filepath.Join(dir, "fs-33554432.img"), path)
			setBit(path, superblockOffset+0x60, incompatRecover)
		}, 64 << 20, ErrNeedsRecovery},
		{"errors recorded", func(path string) {
			image(t, dir, 32<<20, Options{})
			os.Rename(filepath.Join(dir, "fs-33554432.img"), path)
			setBit(path, superblockOffset+0x3A, stateErrors)
		}, 64 << 20, ErrLayout},
		{"flex_bg", func(path string) {
			image(t, dir, 32<<20, Options{})
			os.Rename(filepath.Join(dir, "fs-33554432.img"), path)
			setBit(path, superblockOffset+0x61, 0x02) // INCOMPAT_FLEX_BG 0x200
		}, 64 << 20, ErrLayout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "refused.img")
			defer os.Remove(path)
			tc.make(path)
			before, _ := os.ReadFile(path)
			_, err := growImage(t, path, tc.to)
			if !errors.Is(err, tc.want) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			f, _ := os.Open(path)
			after := make([]byte, len(before))
			f.ReadAt(after, 0)
			f.Close()
			if !bytes.Equal(before, after) {
				t.Fatal("a refused growth wrote")
			}
		})
	}
	if !testutil.HaveTools(t, "mkfs.ext4") {
		return
	}
	path := filepath.Join(dir, "mkfs.img")
	os.WriteFile(path, nil, 0o600)
	os.Truncate(path, 64<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", path).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	if _, err := growImage(t, path, 128<<20); !errors.Is(err, ErrLayout) {
		t.Fatalf("mkfs.ext4's defaults (flex_bg, resize_inode, metadata_csum): %v, want ErrLayout", err)
	}
}

// cutDisk is a disk whose power is cut after its first n writes: the
// writes before are on it, none after.
type cutDisk struct {
	disk
	n, done int
	log     []string
}

var errCut = errors.New("power cut")

func (c *cutDisk) WriteAt(p []byte, off int64) (int, error) {
	if c.done == c.n {
		return 0, errCut
	}
	c.done++
	c.log = append(c.log, fmt.Sprintf("write %d bytes at %d", len(p), off))
	return c.disk.WriteAt(p, off)
}

func (c *cutDisk) zero(off, n int64) error {
	if c.done == c.n {
		return errCut
	}
	c.done++
	c.log = append(c.log, fmt.Sprintf("zero %d bytes at %d", n, off))
	return c.disk.zero(off, n)
}

// TestGrowPowerCut cuts the power after every write of a growth that
// widens a short last group and adds groups with superblock copies, then
// checks what the grow.go comment promises. As the cut leaves it, the
// kernel mounts the file system (read-only: as a look, which does not
// touch it) with every file intact, and e2fsck finds it clean, except
// after the commit and before the widened group's last write, where it
// finds what the growth's next start finishes. Then, as a stage does,
// the growth is started again, with no e2fsck: it finishes, e2fsck finds
// the file system clean, and the kernel mounts it, every file intact,
// and allocates all its free space, from every group, without an error
// (a widened group whose bitmap and descriptor disagree marks the file
// system "with errors" at its first allocation there, and then ENOSPC
// while df shows space).
func TestGrowPowerCut(t *testing.T) {
	testutil.RequireRoot(t)
	if !testutil.HaveTools(t, "e2fsck") {
		return
	}
	dir := t.TempDir()
	const from, to = 100 << 20, 700 << 20
	orig, _ := image(t, dir, from, Options{})
	var sums map[string][sha256.Size]byte
	kernelFS(t, orig, func(mnt string) { sums = someFiles(t, mnt, 8) })
	copyOf := func() (string, *os.File) {
		path := filepath.Join(dir, "cut.img")
		os.Remove(path)
		src, err := os.Open(orig)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		dst, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fsops.CopyFileData(context.Background(), int(dst.Fd()), int(src.Fd()), from, make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		if err := dst.Truncate(to); err != nil {
			t.Fatal(err)
		}
		return path, dst
	}
	// A whole growth, to count its writes and find the commit.
	_, f := copyOf()
	whole := &cutDisk{disk: fileDisk{File: f, regular: true}, n: -1}
	if _, err := grow(whole, to); err != nil {
		t.Fatal(err)
	}
	f.Close()
	commit, last := -1, -1
	for i, w := range whole.log {
		if w == fmt.Sprintf("write 512 bytes at %d", superblockOffset) {
			if commit < 0 {
				commit = i
			} else {
				last = i
			}
		}
	}
	if commit < 0 || last < 0 {
		t.Fatalf("no commit and final superblock write among %q", whole.log)
	}
	t.Logf("%d writes; the commit is write %d, the widened group's last write %d", len(whole.log), commit, last)
	for n := 0; n <= len(whole.log); n++ {
		path, f := copyOf()
		if _, err := grow(&cutDisk{disk: fileDisk{File: f, regular: true}, n: n}, to); n < len(whole.log) && !errors.Is(err, errCut) {
			t.Fatalf("cut after %d writes: %v", n, err)
		}
		f.Close()
		mountFS(t, path, unix.MS_RDONLY, func(mnt string) { checkFiles(t, mnt, sums) })
		out, err := exec.Command("e2fsck", "-fn", path).CombinedOutput()
		inWindow := n > commit && n <= last
		switch {
		case err == nil:
		case inWindow:
			t.Logf("cut after %d writes (after the commit): e2fsck -fn finds %q", n, firstLines(out, 3))
		default:
			t.Fatalf("cut after %d writes (%s): e2fsck -fn: %v\n%s", n, whole.log[max(n-1, 0)], err, out)
		}
		// Started again, the growth finishes (or, past the commit, has
		// nothing left to add but what the cut left undone).
		got, err := growImage(t, path, to)
		if err != nil {
			t.Fatalf("growing again after a cut after %d writes: %v", n, err)
		}
		if want := (Size{Blocks: to / blockSize, BlockSize: blockSize}); got != want {
			t.Fatalf("growing again after a cut after %d writes: %+v, want %+v", n, got, want)
		}
		fsck(t, path)
		kernelFS(t, path, func(mnt string) {
			checkFiles(t, mnt, sums)
			fill(t, mnt)
		})
		if state := superblockField(t, path, "Filesystem state"); state != "clean" {
			t.Fatalf("cut after %d writes, grown again and filled: the file system is %q, want clean", n, state)
		}
		fsck(t, path)
	}
}

// fill allocates every block the file system at mnt has free (but the
// reserve a statfs keeps), which asks the kernel to read every group's
// bitmap against its descriptor.
func fill(t *testing.T, mnt string) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	free := int64(st.Bavail) * st.Bsize
	// Less a few blocks for the file's own extent tree.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, free-64*blockSize); err != nil {
		t.Fatalf("allocating the %d bytes df shows free: %v", free, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// firstLines is e2fsck's findings, its first lines past the passes' names.
func firstLines(out []byte, n int) []string {
	var lines []string
	for _, l := range bytes.Split(out, []byte("\n")) {
		if len(l) == 0 || bytes.HasPrefix(l, []byte("Pass ")) || bytes.HasPrefix(l, []byte("e2fsck ")) {
			continue
		}
		if lines = append(lines, string(l)); len(lines) == n {
			break
		}
	}
	return lines
}
