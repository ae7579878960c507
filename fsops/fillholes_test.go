package fsops

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestFillHoles: a sparse file's holes become written zeros and its data
// stays as it was, wherever the data is, and the file has no hole left.
func TestFillHoles(t *testing.T) {
	const size = 64 << 20
	for _, tc := range []struct {
		name string
		data []int64 // offsets of 1 MiB of data each
	}{
		{"all hole", nil},
		{"data first", []int64{0}},
		{"data in the middle", []int64{20 << 20, 40 << 20}},
		{"data last", []int64{size - 1<<20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "img"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(size); err != nil {
				t.Fatal(err)
			}
			mark := bytes.Repeat([]byte{0xa5}, 1<<20)
			for _, off := range tc.data {
				if _, err := f.WriteAt(mark, off); err != nil {
					t.Fatal(err)
				}
			}
			if err := FillHoles(f, size); err != nil {
				t.Fatal(err)
			}
			ext, err := DataExtents(int(f.Fd()), 0, size)
			if err != nil {
				t.Fatal(err)
			}
			var covered int64
			for _, e := range ext {
				covered += e.Length
			}
			if covered != size {
				t.Fatalf("%d of %d bytes are data after FillHoles: %v", covered, size, ext)
			}
			got := make([]byte, size)
			if _, err := f.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			for _, off := range tc.data {
				copy(want[off:], mark)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("the file's content changed")
			}
			if fi, _ := f.Stat(); fi.Size() != size {
				t.Fatalf("size %d, want %d", fi.Size(), size)
			}
		})
	}
}
