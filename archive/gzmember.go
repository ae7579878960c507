package archive

import (
	"bufio"
	"bytes"
	stdflate "compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sync"

	"github.com/klauspost/compress/flate"
)

// gzipMembers is the tar.gz unit format: each block is a gzip member of
// its own (RFC 1952 2.2: a gzip file is a series of members, and gzip,
// GNU tar and every library read them as one stream) whose header carries
// an extra field, subfield 'H','C' of four bytes, with the member's whole
// length. That is BGZF's idea (htslib's blocked gzip) with a field wide
// enough for megabyte blocks. Members do not share a dictionary, which
// costs a fraction of a percent in size and lets both ends run on every
// core.
//
// The default deflate is klauspost/compress's (the one pgzip and so
// mholt/archives' multithreaded gzip use), several times faster than the
// standard library's; Compact uses the standard library's, whose archives
// are within about 1% of gzip -6 where klauspost's are about 4% larger on
// text (measured in bench/).
type gzipMembers struct {
	level   int
	compact bool
	writers sync.Pool // flateWriter
	readers sync.Pool // io.ReadCloser that is a flate.Resetter
}

type flateWriter interface {
	io.WriteCloser
	Reset(io.Writer)
}

const (
	// gzBlock is the input of one member: large enough that starting
	// without a dictionary costs little, small enough that two cores get
	// several of a modest file.
	gzBlock = 1 << 20
	// gzHeaderLen: the fixed header (10), XLEN (2), the subfield's id
	// and length (4) and the member length (4).
	gzHeaderLen = 20
	gzTrailer   = 8
	// gzMaxUnit bounds what a reader allocates for a member: deflate's
	// stored blocks make incompressible input a few bytes per 64 KiB
	// larger.
	gzMaxUnit = gzBlock + gzBlock/16 + gzHeaderLen + gzTrailer
)

// gzipMemberHeader is a member's header up to its length: deflate, FEXTRA,
// no time, no name, Unix; XLEN 8; subfield 'H','C' of 4 bytes.
var gzipMemberHeader = []byte{0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 3, 8, 0, 'H', 'C', 4, 0}

func (g *gzipMembers) writer(w io.Writer) (flateWriter, error) {
	if fw, ok := g.writers.Get().(flateWriter); ok {
		fw.Reset(w)
		return fw, nil
	}
	if g.compact {
		return stdflate.NewWriter(w, g.level)
	}
	return flate.NewWriter(w, g.level)
}

func (g *gzipMembers) encode(dst, in []byte) ([]byte, error) {
	buf := bytes.NewBuffer(dst[:0])
	buf.Write(gzipMemberHeader)
	buf.Write([]byte{0, 0, 0, 0}) // the length, known at the end
	fw, err := g.writer(buf)
	if err != nil {
		return nil, err
	}
	if _, err := fw.Write(in); err != nil {
		return nil, err
	}
	if err := fw.Close(); err != nil {
		return nil, err
	}
	g.writers.Put(fw)
	out := buf.Bytes()
	out = binary.LittleEndian.AppendUint32(out, crc32.ChecksumIEEE(in))
	out = binary.LittleEndian.AppendUint32(out, uint32(len(in)))
	if len(out) > gzMaxUnit {
		return nil, errTooLarge
	}
	binary.LittleEndian.PutUint32(out[len(gzipMemberHeader):], uint32(len(out)))
	return out, nil
}

// gzipMark is an empty member whose extra subfield, 'H' and id, says it
// opens ('S') or ends ('E') a stream: header, XLEN, the subfield with
// four zero bytes, an empty final deflate block, CRC and size 0.
func gzipMark(id byte) []byte {
	return []byte{0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 3, 8, 0, 'H', id, 4, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0}
}

var gzipStart, gzipEnd = gzipMark('S'), gzipMark('E')

func (g *gzipMembers) marks() ([]byte, []byte) { return gzipStart, gzipEnd }

// isGzipMember tells whether a stream starts like an indexed member, or
// with the start mark.
func isGzipMember(head []byte) bool {
	return bytes.HasPrefix(head, gzipMemberHeader) || len(head) >= 16 && bytes.Equal(head[:16], gzipStart[:16])
}

func (g *gzipMembers) next(r *bufio.Reader, buf []byte) ([]byte, error) {
	// The length in the header is the member's whole length.
	return readUnit(r, buf, gzipMemberHeader, 0, gzHeaderLen+gzTrailer+2, gzMaxUnit)
}

func (g *gzipMembers) decode(dst, unit []byte) ([]byte, error) {
	data := unit[gzHeaderLen : len(unit)-gzTrailer]
	sum := binary.LittleEndian.Uint32(unit[len(unit)-8:])
	size := binary.LittleEndian.Uint32(unit[len(unit)-4:])
	if size > gzBlock {
		return nil, fmt.Errorf("%w: member of %d bytes inflated", errTooLarge, size)
	}
	dst = slices.Grow(dst[:0], int(size))[:size]
	src := bytes.NewReader(data)
	fr, ok := g.readers.Get().(io.ReadCloser)
	if ok {
		_ = fr.(flate.Resetter).Reset(src, nil) // flate's Reset returns nil; a bad stream fails the read
	} else {
		fr = flate.NewReader(src)
	}
	defer g.readers.Put(fr)
	if _, err := io.ReadFull(fr, dst); err != nil {
		return nil, unexpected(err)
	}
	// The deflate stream must end exactly there, and with the member.
	if n, err := fr.Read(make([]byte, 1)); n != 0 || err != io.EOF || src.Len() != 0 {
		return nil, errors.New("gzip member longer than its trailer says")
	}
	if crc32.ChecksumIEEE(dst) != sum {
		return nil, errors.New("gzip member checksum mismatch")
	}
	return dst, nil
}
