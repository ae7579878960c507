package fsops

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Extent is a byte range of a file.
type Extent struct{ Offset, Length int64 }

// DataExtents lists the ranges of the open file fd that hold data (not
// holes) between start and size, from SEEK_DATA/SEEK_HOLE. A file system
// that cannot tell reports everything as data.
func DataExtents(fd int, start, size int64) ([]Extent, error) {
	var out []Extent
	for off := start; off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break
		}
		if err == unix.EINVAL || err == unix.EOPNOTSUPP {
			return []Extent{{off, size - off}}, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "lseek(SEEK_DATA)", Path: "", Err: err}
		}
		if d >= size {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return nil, &os.PathError{Op: "lseek(SEEK_HOLE)", Path: "", Err: err}
		}
		h = min(h, size)
		out = append(out, Extent{d, h - d})
		off = h
	}
	return out, nil
}

// ChangedRanges compares two files of the same logical size block by
// block, over the ranges where either holds data (holes read as zeros),
// and returns the blocks that differ, adjacent ones merged. Only data is
// read: a 10 GiB image holding 200 MiB costs about 200 MiB per file. And
// of that, blocks the two files share on disk (SharedRanges: a reflinked
// copy not written since) are not read at all: two snapshots of a volume
// cut by FICLONE cost what changed between them.
func ChangedRanges(a, b *os.File, start, size, block int64) ([]Extent, error) {
	st, err := CompareRanges(a, b, start, size, block)
	return st.Changed, err
}

// Comparison is what CompareRanges found: the blocks that differ, and the
// bytes of each file it had to read to know.
type Comparison struct {
	Changed []Extent
	Read    int64
}

// CompareRanges is ChangedRanges, saying how much it read.
func CompareRanges(a, b *os.File, start, size, block int64) (Comparison, error) {
	ma, err := mapExtents(a, start, size)
	if err != nil {
		return Comparison{}, err
	}
	mb, err := mapExtents(b, start, size)
	if err != nil {
		return Comparison{}, err
	}
	ea, eb := ma.data, mb.data
	if !ma.ok || !mb.ok { // no FIEMAP (tmpfs): SEEK_DATA, and nothing shared
		if ea, err = DataExtents(int(a.Fd()), start, size); err != nil {
			return Comparison{}, err
		}
		if eb, err = DataExtents(int(b.Fd()), start, size); err != nil {
			return Comparison{}, err
		}
	}
	union := subtractExtents(mergeExtents(append(ea, eb...), block), shared(ma.plain, mb.plain, start, size), block)
	cmp := Comparison{}
	out := cmp.Changed
	bufA, bufB := make([]byte, 1<<20), make([]byte, 1<<20)
	for _, e := range union {
		for off := e.Offset; off < e.Offset+e.Length; {
			// Extents are aligned to whole blocks; the last one stops at size.
			n := min(int64(len(bufA)), e.Offset+e.Length-off, size-off)
			if n <= 0 {
				break
			}
			if err := readAtZeroFill(a, bufA[:n], off); err != nil {
				return cmp, err
			}
			if err := readAtZeroFill(b, bufB[:n], off); err != nil {
				return cmp, err
			}
			cmp.Read += n
			for i := int64(0); i < n; i += block {
				j := min(i+block, n)
				if bytes.Equal(bufA[i:j], bufB[i:j]) {
					continue
				}
				if k := len(out) - 1; k >= 0 && out[k].Offset+out[k].Length == off+i {
					out[k].Length += j - i
				} else {
					out = append(out, Extent{off + i, j - i})
				}
			}
			off += n
		}
	}
	cmp.Changed = out
	return cmp, nil
}

// subtractExtents is es (sorted, merged, block-aligned) without the whole
// blocks that the sorted ranges of cut cover.
func subtractExtents(es, cut []Extent, block int64) []Extent {
	var out []Extent
	j := 0
	for _, e := range es {
		off, end := e.Offset, e.Offset+e.Length
		for ; j < len(cut) && off < end; j++ {
			// cut[j], shrunk to the whole blocks it covers.
			cs := (cut[j].Offset + block - 1) / block * block
			ce := (cut[j].Offset + cut[j].Length) / block * block
			if ce <= cs || ce <= off {
				continue // no whole block of it, or all before off
			}
			if cs >= end {
				break
			}
			if cs > off {
				out = append(out, Extent{off, cs - off})
			}
			off = max(off, ce)
			if ce > end {
				break // it reaches into the next extent too
			}
		}
		if off < end {
			out = append(out, Extent{off, end - off})
		}
	}
	return out
}

// readAtZeroFill fills p from f at off. Bytes past the end of the file
// read as zeros (a block is a hole there), never as what the buffer held
// from the previous chunk.
func readAtZeroFill(f *os.File, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return err
	}
	clear(p[n:])
	return nil
}

// mergeExtents sorts, aligns to block and merges overlapping extents.
func mergeExtents(es []Extent, block int64) []Extent {
	for i := range es {
		s := es[i].Offset / block * block
		e := (es[i].Offset + es[i].Length + block - 1) / block * block
		es[i] = Extent{s, e - s}
	}
	// A fragmented image has hundreds of thousands of extents.
	slices.SortFunc(es, func(x, y Extent) int { return cmp.Compare(x.Offset, y.Offset) })
	var out []Extent
	for _, e := range es {
		if k := len(out) - 1; k >= 0 && e.Offset <= out[k].Offset+out[k].Length {
			if end := e.Offset + e.Length; end > out[k].Offset+out[k].Length {
				out[k].Length = end - out[k].Offset
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

// DataSum is a checksum of the open file f's data: sha256 over each range
// DataExtents finds, as its offset and length (big-endian, 8 bytes each)
// and then its bytes. Holes are not read, so a sparse image costs what it
// holds. Two files with the same data in the same ranges have the same
// sum; a changed byte, or data moved or gone, changes it.
func DataSum(f *os.File) (string, error) {
	size, _, err := FileSize(f)
	if err != nil {
		return "", err
	}
	ranges, err := DataExtents(int(f.Fd()), 0, size)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	var head [16]byte
	for _, e := range ranges {
		binary.BigEndian.PutUint64(head[:8], uint64(e.Offset))
		binary.BigEndian.PutUint64(head[8:], uint64(e.Length))
		h.Write(head[:])
		if _, err := io.Copy(h, io.NewSectionReader(f, e.Offset, e.Length)); err != nil {
			return "", &os.PathError{Op: "read", Path: f.Name(), Err: err}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
