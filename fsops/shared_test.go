package fsops

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

func TestSubtractExtents(t *testing.T) {
	const b = 4096
	for _, tc := range []struct {
		name    string
		es, cut []Extent
		want    []Extent
	}{
		{"nothing cut", []Extent{{0, 4 * b}}, nil, []Extent{{0, 4 * b}}},
		{"all cut", []Extent{{0, 4 * b}}, []Extent{{0, 4 * b}}, nil},
		{"middle cut", []Extent{{0, 4 * b}}, []Extent{{b, 2 * b}}, []Extent{{0, b}, {3 * b, b}}},
		// Only whole blocks of a cut count: a partial one is still read.
		{"partial blocks kept", []Extent{{0, 4 * b}}, []Extent{{b + 1, 2*b - 2}}, []Extent{{0, 4 * b}}},
		{"partial edges", []Extent{{0, 4 * b}}, []Extent{{b - 10, 2*b + 20}}, []Extent{{0, b}, {3 * b, b}}},
		{"cut across two extents", []Extent{{0, 2 * b}, {4 * b, 2 * b}}, []Extent{{b, 4 * b}}, []Extent{{0, b}, {5 * b, b}}},
		{"cuts in gaps", []Extent{{2 * b, b}}, []Extent{{0, b}, {4 * b, b}}, []Extent{{2 * b, b}}},
		{"several cuts in one", []Extent{{0, 8 * b}}, []Extent{{b, b}, {3 * b, b}, {5 * b, 3 * b}}, []Extent{{0, b}, {2 * b, b}, {4 * b, b}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := subtractExtents(tc.es, tc.cut, b); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSharedRanges: on the file systems that share blocks, a reflinked
// copy shares every block with its source until one is written; the
// comparison then reads only the written blocks and still finds each
// change a full read finds. On ext4, which cannot share, nothing is
// shared and everything with data is read; so on tmpfs, which has no
// FIEMAP (SEEK_DATA finds the data there).
func TestSharedRanges(t *testing.T) {
	const size, block = 8 << 20, 4096
	for _, fstype := range []string{"xfs", "btrfs", "ext4", "tmpfs"} {
		t.Run(fstype, func(t *testing.T) {
			var args []string
			if fstype == "xfs" {
				args = []string{"-m", "reflink=1"}
			}
			var dir string
			if fstype == "tmpfs" {
				dir = tmpfsDir(t)
			} else {
				dir = testfs.FileSystem(t, run, fstype, 300<<20, args, "")
			}
			data := make([]byte, size)
			rand.New(rand.NewSource(1)).Read(data)
			a := writeTemp(t, dir, "a", data)
			if err := a.Sync(); err != nil {
				t.Fatal(err)
			}
			bp := filepath.Join(dir, "b")
			out, err := os.Create(bp)
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			if err := unix.IoctlFileClone(int(out.Fd()), int(a.Fd())); err != nil {
				if fstype != "ext4" && fstype != "tmpfs" {
					t.Fatalf("FICLONE on %s: %v", fstype, err)
				}
				if _, err := out.Write(data); err != nil { // ext4: a plain copy
					t.Fatal(err)
				}
			}
			// Three writes into the copy: one block, a run of blocks,
			// and a byte (its block changes).
			writes := []Extent{{block, block}, {2 << 20, 64 << 10}, {size - 100, 1}}
			for _, w := range writes {
				if _, err := out.WriteAt(bytes.Repeat([]byte{0x5a}, int(w.Length)), w.Offset); err != nil {
					t.Fatal(err)
				}
			}
			if err := out.Sync(); err != nil {
				t.Fatal(err)
			}
			shared, err := SharedRanges(a, out, 0, size)
			if err != nil {
				t.Fatal(err)
			}
			var sharedBytes int64
			for _, s := range shared {
				sharedBytes += s.Length
				for _, w := range writes {
					if s.Offset < w.Offset+w.Length && w.Offset < s.Offset+s.Length {
						t.Fatalf("range %v is reported shared, but %v was written there", s, w)
					}
				}
			}
			cmp, err := CompareRanges(a, out, 0, size, block)
			if err != nil {
				t.Fatal(err)
			}
			want := naiveChanged(t, a, out, size, block)
			if fmt.Sprint(cmp.Changed) != fmt.Sprint(want) {
				t.Fatalf("changed %v, a full read finds %v", cmp.Changed, want)
			}
			t.Logf("%s: %d of %d bytes shared, %d read to compare, changed %v", fstype, sharedBytes, size, cmp.Read, cmp.Changed)
			if fstype == "ext4" || fstype == "tmpfs" {
				if sharedBytes != 0 || cmp.Read != size {
					t.Fatalf("%s shares %d bytes and reads %d, want 0 and %d", fstype, sharedBytes, cmp.Read, size)
				}
				return
			}
			// What was not written stays shared (the file systems' own
			// extent granularity may unshare a little around a write).
			if cmp.Read > 1<<20 || sharedBytes < size-(1<<20) {
				t.Fatalf("read %d bytes and %d shared, of %d: the reflinked blocks were not skipped", cmp.Read, sharedBytes, size)
			}
		})
	}
}

// tmpfsDir is a tmpfs mounted for the test.
func tmpfsDir(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	return dir
}

// naiveChanged compares every block of both files.
func naiveChanged(t *testing.T, a, b *os.File, size, block int64) []Extent {
	t.Helper()
	var out []Extent
	x, y := make([]byte, block), make([]byte, block)
	for off := int64(0); off < size; off += block {
		n := min(block, size-off)
		if err := readAtZeroFill(a, x[:n], off); err != nil {
			t.Fatal(err)
		}
		if err := readAtZeroFill(b, y[:n], off); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(x[:n], y[:n]) {
			continue
		}
		if k := len(out) - 1; k >= 0 && out[k].Offset+out[k].Length == off {
			out[k].Length += n
		} else {
			out = append(out, Extent{off, n})
		}
	}
	return out
}
