package archive

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"github.com/hostpath-csi/hostpath/fsops"
)

// A delta stream turns a copy of one cut of an image into a copy of a later
// cut: the later cut's size, then each range that changed between the two,
// as its bytes or, where it now reads as zeros, as a hole (no bytes), then
// an end record repeating the count of bytes sent. It is what a standby
// copy is kept by. Unlike an extents stream it is applied over data, so a
// range that became zeros must say so; a stream without its end record is
// ErrFormat, so a cut at any boundary is an error, never a half-applied
// generation that looks whole.
//
//	"hostpath-delta-1" size:u64
//	{ offset:u64 length:u64 bytes[length] }*   (length's top bit: zeros, no bytes)
//	endMark:u64 total:u64
const deltaMagic = "hostpath-delta-1"

// zeroRange is the bit of a delta record's length marking a range of zeros.
const zeroRange = uint64(1) << 63

// WriteDelta streams the ranges changed (sorted, not overlapping, within
// size) of f, an image of size bytes.
func WriteDelta(ctx context.Context, f *os.File, size int64, changed []fsops.Extent, w io.Writer) (Stats, error) {
	var st Stats
	bw := bufio.NewWriterSize(w, extentChunk)
	if err := writeHead(bw, deltaMagic, size); err != nil {
		return st, err
	}
	hdr := make([]byte, 16)
	record := func(off, n int64, data []byte) error {
		l := uint64(n)
		if data == nil {
			l |= zeroRange
		}
		binary.BigEndian.PutUint64(hdr[:8], uint64(off))
		binary.BigEndian.PutUint64(hdr[8:], l)
		if _, err := bw.Write(hdr); err != nil {
			return err
		}
		if data != nil {
			st.Bytes += n
			_, err := bw.Write(data)
			return err
		}
		return nil
	}
	p := fsops.ProgressFrom(ctx)
	buf := make([]byte, extentChunk)
	var next int64
	for _, e := range changed {
		if e.Offset < next || e.Length <= 0 || e.Offset+e.Length > size {
			return st, fmt.Errorf("changed range %d+%d out of order or beyond %d", e.Offset, e.Length, size)
		}
		next = e.Offset + e.Length
		for off := e.Offset; off < next; {
			if err := ctx.Err(); err != nil {
				return st, err
			}
			n := int(min(int64(len(buf)), next-off))
			if err := readFull(f, buf[:n], off); err != nil {
				return st, err
			}
			at := 0
			for _, r := range nonZeroRuns(buf[:n]) {
				if r[0] > at {
					if err := record(off+int64(at), int64(r[0]-at), nil); err != nil {
						return st, err
					}
				}
				if err := record(off+int64(r[0]), int64(r[1]-r[0]), buf[r[0]:r[1]]); err != nil {
					return st, err
				}
				at = r[1]
			}
			if at < n {
				if err := record(off+int64(at), int64(n-at), nil); err != nil {
					return st, err
				}
			}
			off += int64(n)
			p.AddBytes(int64(n))
		}
	}
	st.DataBytes, st.Files = st.Bytes, 1
	return st, writeEnd(bw, st.Bytes)
}

// readFull reads len(b) bytes of f at off; what lies past its end reads as
// zeros (an image grows by truncate).
func readFull(f *os.File, b []byte, off int64) error {
	n, err := f.ReadAt(b, off)
	if err == io.EOF {
		clear(b[n:])
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s at %d: %w", f.Name(), off, err)
	}
	return nil
}

// ApplyDelta applies a delta stream to f, a copy of the cut the delta was
// taken against: the changed ranges written, the zeroed ones punched, the
// size set to the stream's. An image of more than max bytes (when max >
// 0) is ErrTooLarge before anything is written. A stream whose ranges
// overlap, go backwards or beyond its size, or that ends early, is
// ErrFormat, and f is then part old, part new: the caller applies to a
// copy it discards on error.
func ApplyDelta(ctx context.Context, r io.Reader, f *os.File, max int64) (int64, Stats, error) {
	var st Stats
	br := bufio.NewReaderSize(r, extentChunk)
	size, err := readHead(br, deltaMagic, "a delta")
	if err != nil {
		return 0, st, err
	}
	if max > 0 && size > uint64(max) {
		return 0, st, fmt.Errorf("%w: an image of %d bytes, %d allowed", ErrTooLarge, size, max)
	}
	// A smaller image drops its tail first; a larger one grows at the end.
	if fi, err := f.Stat(); err != nil {
		return 0, st, err
	} else if uint64(fi.Size()) > size {
		if err := f.Truncate(int64(size)); err != nil {
			return 0, st, err
		}
	}
	p := fsops.ProgressFrom(ctx)
	fd := int(f.Fd())
	buf := make([]byte, extentChunk)
	hdr := make([]byte, 16)
	var next uint64
	for {
		if err := ctx.Err(); err != nil {
			return 0, st, err
		}
		if _, err := io.ReadFull(br, hdr); err != nil {
			return 0, st, fmt.Errorf("%w: cut before its end: %v", ErrFormat, err)
		}
		off, l := binary.BigEndian.Uint64(hdr[:8]), binary.BigEndian.Uint64(hdr[8:])
		if off == endMark {
			if l != uint64(st.Bytes) {
				return 0, st, fmt.Errorf("%w: %d bytes, the end says %d", ErrFormat, st.Bytes, l)
			}
			break
		}
		zero, n := l&zeroRange != 0, l&^zeroRange
		if off < next || n == 0 || n > size || off > size-n {
			return 0, st, fmt.Errorf("%w: range %d+%d out of order or beyond %d", ErrFormat, off, n, size)
		}
		next = off + n
		if zero {
			if err := fsops.PunchHole(fd, int64(off), int64(n)); err != nil {
				return 0, st, err
			}
			continue
		}
		for done := uint64(0); done < n; {
			c := min(uint64(len(buf)), n-done)
			if _, err := io.ReadFull(br, buf[:c]); err != nil {
				return 0, st, fmt.Errorf("%w: cut inside a range: %v", ErrFormat, err)
			}
			if err := fsops.PwriteAll(fd, buf[:c], int64(off+done)); err != nil {
				return 0, st, err
			}
			done += c
			st.Bytes += int64(c)
			p.AddBytes(int64(c))
		}
	}
	if err := f.Truncate(int64(size)); err != nil {
		return 0, st, err
	}
	st.DataBytes, st.Files = st.Bytes, 1
	return int64(size), st, nil
}
