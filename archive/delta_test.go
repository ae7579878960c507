package archive

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/hostpath-csi/hostpath/fsops"
)

// image writes a file of size bytes: random data where fill says, holes
// elsewhere.
func image(t *testing.T, path string, size int64, fill []fsops.Extent, seed uint64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(seed, seed))
	for _, e := range fill {
		b := make([]byte, e.Length)
		for i := range b {
			b[i] = byte(r.Uint32() | 1)
		}
		if _, err := f.WriteAt(b, e.Offset); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

// TestDelta: a copy of the earlier image with the delta applied reads as
// the later image, byte for byte, whatever changed between them: data
// rewritten, data zeroed, the image grown or shrunk; and only the changed
// bytes travel.
func TestDelta(t *testing.T) {
	const M = 1 << 20
	base := []fsops.Extent{{Offset: 0, Length: 2 * M}, {Offset: 5 * M, Length: 3 * M}}
	for _, tc := range []struct {
		name      string
		size      int64
		later     []fsops.Extent // written over a copy of base, with other data
		zeroed    []fsops.Extent // punched in the later image
		wantBytes int64          // data bytes the delta carries
	}{
		{"nothing changed", 8 * M, nil, nil, 0},
		{"a block rewritten", 8 * M, []fsops.Extent{{Offset: 4096, Length: 4096}}, nil, 4096},
		{"data into a hole", 8 * M, []fsops.Extent{{Offset: 3 * M, Length: M}}, nil, M},
		{"data zeroed", 8 * M, nil, []fsops.Extent{{Offset: 5 * M, Length: M}}, 0},
		{"grown, written at the end", 12 * M, []fsops.Extent{{Offset: 11 * M, Length: M}}, nil, M},
		{"shrunk", 6 * M, []fsops.Extent{{Offset: M, Length: 4096}}, nil, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "copy")
			image(t, a, 8*M, base, 1)
			image(t, c, 8*M, base, 1)
			image(t, b, 8*M, base, 1)
			fb, err := os.OpenFile(b, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer fb.Close()
			r := rand.New(rand.NewPCG(2, 2))
			for _, e := range tc.later {
				d := make([]byte, e.Length)
				for i := range d {
					d[i] = byte(r.Uint32() | 1)
				}
				if _, err := fb.WriteAt(d, e.Offset); err != nil {
					t.Fatal(err)
				}
			}
			for _, e := range tc.zeroed {
				if err := fsops.PunchHole(int(fb.Fd()), e.Offset, e.Length); err != nil {
					t.Fatal(err)
				}
			}
			if err := fb.Truncate(tc.size); err != nil {
				t.Fatal(err)
			}
			fa, err := os.Open(a)
			if err != nil {
				t.Fatal(err)
			}
			defer fa.Close()
			changed, err := fsops.ChangedRanges(fa, fb, 0, tc.size, 4096)
			if err != nil {
				t.Fatal(err)
			}
			var stream bytes.Buffer
			st, err := WriteDelta(context.Background(), fb, tc.size, changed, &stream)
			if err != nil {
				t.Fatal(err)
			}
			if st.Bytes != tc.wantBytes {
				t.Errorf("the delta carries %d bytes, want %d", st.Bytes, tc.wantBytes)
			}
			fc, err := os.OpenFile(c, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer fc.Close()
			size, _, err := ApplyDelta(context.Background(), bytes.NewReader(stream.Bytes()), fc, 0)
			if err != nil || size != tc.size {
				t.Fatalf("ApplyDelta: size %d, %v; want %d", size, err, tc.size)
			}
			want, _ := os.ReadFile(b)
			got, _ := os.ReadFile(c)
			if !bytes.Equal(got, want) {
				t.Fatalf("the copy differs from the later image (%d and %d bytes)", len(got), len(want))
			}
		})
	}
}

// TestDeltaRefused: a delta cut anywhere, one over the limit, one whose
// ranges overlap, and ranges out of order handed to WriteDelta are each an
// error; a cut or malformed stream is ErrFormat.
func TestDeltaRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "img")
	image(t, path, 1<<20, []fsops.Extent{{Offset: 0, Length: 1 << 20}}, 3)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stream bytes.Buffer
	if _, err := WriteDelta(context.Background(), f, 1<<20, []fsops.Extent{{Offset: 0, Length: 4096}, {Offset: 8192, Length: 4096}}, &stream); err != nil {
		t.Fatal(err)
	}
	full := stream.Bytes()
	apply := func(b []byte, max int64) error {
		c, err := os.Create(filepath.Join(dir, "copy"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _, err = ApplyDelta(context.Background(), bytes.NewReader(b), c, max)
		return err
	}
	for _, cut := range []int{0, 10, len(deltaMagic) + 8, len(deltaMagic) + 8 + 16 + 100, len(full) - 16, len(full) - 1} {
		if err := apply(full[:cut], 0); !errors.Is(err, ErrFormat) {
			t.Errorf("cut at %d of %d: %v, want ErrFormat", cut, len(full), err)
		}
	}
	if err := apply(full, 1<<19); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v, want ErrTooLarge", err)
	}
	// The second range's offset moved into the first.
	bad := bytes.Clone(full)
	second := len(deltaMagic) + 8 + 16 + 4096
	bad[second+6] = 0
	bad[second+7] = 0x10
	if err := apply(bad, 0); !errors.Is(err, ErrFormat) {
		t.Errorf("overlapping ranges: %v, want ErrFormat", err)
	}
	if _, err := WriteDelta(context.Background(), f, 1<<20, []fsops.Extent{{Offset: 8192, Length: 4096}, {Offset: 0, Length: 4096}}, &bytes.Buffer{}); err == nil {
		t.Error("ranges out of order were written")
	}
}
