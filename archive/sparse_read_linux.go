package archive

import (
	"archive/tar"
	"io"
	"strconv"
	"strings"

	"github.com/hostpath-csi/hostpath/fsops"
)

// Restoring a sparse file through Go's tar reader costs its whole size:
// the reader hands every hole to its caller as zeros (it cannot say where
// the holes are; golang/go issue 22735), so a tenant's `truncate -s 16T`
// file, a few hundred bytes archived, would be 16 TiB of zeros to make
// and to scan. The writer therefore also records the data extents in a
// PAX record of its own (sparseMapKey, beside GNU's map, which other tars
// read), and the extractor reads those extents' bytes from the stream
// itself, past the tar reader, seeking over the holes. The tar reader
// still accounts for the entry: the tap feeds it as many zero bytes as
// were taken, which it discards before its next header.

// sparseMapKey is the writer's PAX record of a sparse file's data
// extents: "offset,length,offset,length,..." in the file, ascending.
const sparseMapKey = "HOSTPATH.sparse.map"

// maxSparseMapRecord bounds that record: Go's reader takes PAX headers of
// up to 1 MiB in all. A file with more extents than fit is restored
// through the tar reader, as another tar's archive is.
const maxSparseMapRecord = 256 << 10

// sparseMapRecord is the record's value for exts, or "" if it is too long.
func sparseMapRecord(exts []fsops.Extent) string {
	var b strings.Builder
	for _, e := range exts {
		if e.Length == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(e.Offset, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(e.Length, 10))
		if b.Len() > maxSparseMapRecord {
			return ""
		}
	}
	if b.Len() == 0 {
		return "-" // no data at all: all hole
	}
	return b.String()
}

// sparseMapOf is the data extents an entry's record names, checked: in
// order, not overlapping, within the file; ok false if the entry has none
// (or the tar reader does not read it as a GNU 1.0 sparse file, whose
// physical data is those extents).
func sparseMapOf(h *tar.Header) (exts []fsops.Extent, ok bool) {
	v, has := h.PAXRecords[sparseMapKey]
	if !has || h.PAXRecords["GNU.sparse.major"] != "1" || h.PAXRecords["GNU.sparse.minor"] != "0" || h.Typeflag != tar.TypeReg {
		return nil, false
	}
	if v == "-" {
		return nil, true
	}
	f := strings.Split(v, ",")
	if len(f)%2 != 0 {
		return nil, false
	}
	end := int64(0)
	for i := 0; i < len(f); i += 2 {
		off, err1 := strconv.ParseInt(f[i], 10, 64)
		n, err2 := strconv.ParseInt(f[i+1], 10, 64)
		if err1 != nil || err2 != nil || off < end || n <= 0 || off > h.Size-n {
			return nil, false
		}
		exts = append(exts, fsops.Extent{Offset: off, Length: n})
		end = off + n
	}
	return exts, true
}

// sparseTap is the stream under the tar reader. take reads n bytes past
// the tar reader, which are then owed to it as zeros.
type sparseTap struct {
	r   io.Reader
	owe int64
}

// Read implements io.Reader (and no Seeker: the tar reader must read
// what it skips, so the zeros owed are what it skips).
func (t *sparseTap) Read(p []byte) (int, error) {
	if t.owe > 0 {
		n := int(min(int64(len(p)), t.owe))
		clear(p[:n])
		t.owe -= int64(n)
		return n, nil
	}
	return t.r.Read(p)
}

// take fills p from the stream itself and owes the tar reader as much
// (the entry's data, which it skips once the entry is done).
func (t *sparseTap) take(p []byte) error {
	n, err := io.ReadFull(t.r, p)
	t.owe += int64(n)
	return err
}
