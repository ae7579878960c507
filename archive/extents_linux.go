package archive

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"github.com/hostpath-csi/hostpath/fsops"
)

// An extents stream is the archive of one sparse file, a block volume's
// image: the file's size, then each range that holds data (offset, length,
// bytes), then an end record repeating the count of data bytes. Holes are
// not sent and stay holes; a stream without its end record is ErrFormat,
// so a cut at any boundary is an error, not a shorter image.
//
//	"hostpath-extents" size:u64
//	{ offset:u64 length:u64 bytes[length] }*
//	endMark:u64 total:u64
const extentsMagic = "hostpath-extents"

const endMark = ^uint64(0)

// writeHead opens a stream of one image (extents or delta): its magic and
// the image's size.
func writeHead(bw *bufio.Writer, magic string, size int64) error {
	if _, err := bw.WriteString(magic); err != nil {
		return err
	}
	return binary.Write(bw, binary.BigEndian, uint64(size))
}

// readHead reads what writeHead wrote, for a stream of kind ("extents",
// "delta"): ErrFormat for another stream or a size no image has.
func readHead(br *bufio.Reader, magic, kind string) (uint64, error) {
	head := make([]byte, len(magic)+8)
	if _, err := io.ReadFull(br, head); err != nil {
		return 0, fmt.Errorf("%w: no header of %s stream: %v", ErrFormat, kind, err)
	}
	if string(head[:len(magic)]) != magic {
		return 0, fmt.Errorf("%w: not %s stream", ErrFormat, kind)
	}
	size := binary.BigEndian.Uint64(head[len(magic):])
	if size > 1<<62 {
		return 0, fmt.Errorf("%w: size %d", ErrFormat, size)
	}
	return size, nil
}

// writeEnd closes a stream of one image: the end mark and the count of
// data bytes sent, then the flush.
func writeEnd(bw *bufio.Writer, total int64) error {
	if err := binary.Write(bw, binary.BigEndian, [2]uint64{endMark, uint64(total)}); err != nil {
		return err
	}
	return bw.Flush()
}

// extentChunk is how much of an extent is read and written at once.
const extentChunk = 1 << 20

// WriteExtents streams the first size bytes of f as an extents stream.
func WriteExtents(ctx context.Context, f *os.File, size int64, w io.Writer) (Stats, error) {
	var st Stats
	exts, err := fsops.DataExtents(int(f.Fd()), 0, size)
	if err != nil {
		return st, err
	}
	bw := bufio.NewWriterSize(w, extentChunk)
	if err := writeHead(bw, extentsMagic, size); err != nil {
		return st, err
	}
	hdr := make([]byte, 16)
	p := fsops.ProgressFrom(ctx)
	buf := make([]byte, extentChunk)
	for _, e := range exts {
		for off := e.Offset; off < e.Offset+e.Length; {
			if err := ctx.Err(); err != nil {
				return st, err
			}
			n := int(min(int64(len(buf)), e.Offset+e.Length-off))
			if _, err := f.ReadAt(buf[:n], off); err != nil {
				// A file that shrank under the walk is not an image of it.
				return st, fmt.Errorf("reading %s at %d: %w", f.Name(), off, err)
			}
			// Zeros inside an extent (preallocated blocks a copy made
			// into data, a disk image's empty space) are holes on the
			// wire too: only runs of non-zero blocks are sent.
			for _, r := range nonZeroRuns(buf[:n]) {
				binary.BigEndian.PutUint64(hdr[:8], uint64(off+int64(r[0])))
				binary.BigEndian.PutUint64(hdr[8:], uint64(r[1]-r[0]))
				if _, err := bw.Write(hdr); err != nil {
					return st, err
				}
				if _, err := bw.Write(buf[r[0]:r[1]]); err != nil {
					return st, err
				}
				st.Bytes += int64(r[1] - r[0])
			}
			off += int64(n)
			p.AddBytes(int64(n))
		}
	}
	st.DataBytes, st.Files = st.Bytes, 1
	return st, writeEnd(bw, st.Bytes)
}

// ExtentsLimit bounds what ExtractExtents writes: an image that declares
// more than Max bytes (when Max > 0) is ErrTooLarge before anything is
// written, or, with Clip, is written only up to Max (what lies beyond is
// read and dropped) and has that size.
type ExtentsLimit struct {
	Max  int64
	Clip bool
}

// ExtractExtents writes an extents stream into f, which should be empty:
// data where the stream has it (runs of zeros left as holes), the size it
// declares (or the limit it is clipped to). It returns that size. A
// stream whose ranges overlap, go backwards or beyond the size, or that
// ends early, is ErrFormat.
func ExtractExtents(ctx context.Context, r io.Reader, f *os.File, limit ExtentsLimit) (int64, Stats, error) {
	var st Stats
	br := bufio.NewReaderSize(r, extentChunk)
	size, err := readHead(br, extentsMagic, "an extents")
	if err != nil {
		return 0, st, err
	}
	keep := size // what is written of the image
	if limit.Max > 0 && size > uint64(limit.Max) {
		if !limit.Clip {
			return 0, st, fmt.Errorf("%w: an image of %d bytes, %d allowed", ErrTooLarge, size, limit.Max)
		}
		keep = uint64(limit.Max)
	}
	p := fsops.ProgressFrom(ctx)
	buf := make([]byte, extentChunk)
	hdr := make([]byte, 16)
	var next uint64 // no extent may start before it
	for {
		if _, err := io.ReadFull(br, hdr); err != nil {
			return 0, st, fmt.Errorf("%w: cut before its end: %v", ErrFormat, err)
		}
		off, n := binary.BigEndian.Uint64(hdr[:8]), binary.BigEndian.Uint64(hdr[8:])
		if off == endMark {
			if n != uint64(st.Bytes) {
				return 0, st, fmt.Errorf("%w: %d data bytes, the end says %d", ErrFormat, st.Bytes, n)
			}
			break
		}
		if off < next || n > size || off > size-n {
			return 0, st, fmt.Errorf("%w: extent %d+%d out of order or beyond %d", ErrFormat, off, n, size)
		}
		next = off + n
		for done := uint64(0); done < n; {
			if err := ctx.Err(); err != nil {
				return 0, st, err
			}
			c := min(uint64(len(buf)), n-done)
			if _, err := io.ReadFull(br, buf[:c]); err != nil {
				return 0, st, fmt.Errorf("%w: cut inside an extent: %v", ErrFormat, err)
			}
			if at := off + done; at < keep {
				if _, err := fsops.WriteSparseAt(int(f.Fd()), buf[:min(c, keep-at)], int64(at)); err != nil {
					return 0, st, err
				}
			}
			done += c
			st.Bytes += int64(c)
			p.AddBytes(int64(c))
		}
	}
	if err := f.Truncate(int64(keep)); err != nil {
		return 0, st, err
	}
	st.DataBytes, st.Files = st.Bytes, 1
	return int64(keep), st, nil
}

// zeroBlock is the unit below which zeros are sent as they are.
const zeroBlock = 64 << 10

var zeros = make([]byte, zeroBlock)

// nonZeroRuns returns the [start, end) runs of b made of zeroBlock blocks
// that are not all zeros.
func nonZeroRuns(b []byte) [][2]int {
	var runs [][2]int
	start := -1
	for off := 0; off < len(b); off += zeroBlock {
		end := min(off+zeroBlock, len(b))
		if bytes.Equal(b[off:end], zeros[:end-off]) {
			if start >= 0 {
				runs = append(runs, [2]int{start, off})
				start = -1
			}
		} else if start < 0 {
			start = off
		}
	}
	if start >= 0 {
		runs = append(runs, [2]int{start, len(b)})
	}
	return runs
}
