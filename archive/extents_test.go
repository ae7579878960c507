package archive

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestExtentsLimit: an extents stream of a 4 MiB image with 1 MiB of data
// at 0 and at 3 MiB is written whole within its limit; beyond the limit it
// is refused before a byte is written, or, clipped, written up to the
// limit only (an extent across it cut there); a stream cut short is
// ErrFormat.
func TestExtentsLimit(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("extent! "), 1<<17) // 1 MiB
	src.WriteAt(data, 0)
	src.WriteAt(data, 3<<20)
	var stream bytes.Buffer
	if _, err := WriteExtents(context.Background(), src, 4<<20, &stream); err != nil {
		t.Fatal(err)
	}
	src.Close()
	const mib = 1 << 20
	for _, tc := range []struct {
		name     string
		limit    ExtentsLimit
		cut      int // bytes of the stream left out at its end
		wantSize int64
		wantErr  error
	}{
		{"no limit", ExtentsLimit{}, 0, 4 * mib, nil},
		{"within", ExtentsLimit{Max: 8 * mib}, 0, 4 * mib, nil},
		{"exactly", ExtentsLimit{Max: 4 * mib}, 0, 4 * mib, nil},
		{"too large", ExtentsLimit{Max: 2 * mib}, 0, 0, ErrTooLarge},
		{"clipped before the second extent", ExtentsLimit{Max: 2 * mib, Clip: true}, 0, 2 * mib, nil},
		{"clipped across the second extent", ExtentsLimit{Max: 3*mib + mib/2, Clip: true}, 0, 3*mib + mib/2, nil},
		{"cut short", ExtentsLimit{}, 100, 0, ErrFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			b := stream.Bytes()
			size, _, err := ExtractExtents(context.Background(), bytes.NewReader(b[:len(b)-tc.cut]), out, tc.limit)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			fi, _ := out.Stat()
			if errors.Is(tc.wantErr, ErrTooLarge) && fi.Size() != 0 {
				t.Fatalf("a refused image wrote %d bytes", fi.Size())
			}
			if err != nil {
				return
			}
			if size != tc.wantSize || fi.Size() != tc.wantSize {
				t.Fatalf("size %d, file %d, want %d", size, fi.Size(), tc.wantSize)
			}
			got := make([]byte, fi.Size())
			out.ReadAt(got, 0)
			want := make([]byte, 4*mib)
			copy(want, data)
			copy(want[3*mib:], data)
			if !bytes.Equal(got, want[:tc.wantSize]) {
				t.Fatal("the image's bytes differ")
			}
		})
	}
}
