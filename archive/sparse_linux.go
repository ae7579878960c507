package archive

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"time"

	"github.com/hostpath-csi/hostpath/fsops"
)

// Go's archive/tar reads sparse files but cannot write them (golang/go
// issue 22735), so a sparse file's entry is written here by hand in the
// GNU sparse 1.0 PAX format that GNU tar, bsdtar and Go's reader all
// understand: a PAX header with GNU.sparse.{major,minor,name,realsize},
// then a file entry whose content is the text map of data extents followed
// by the extents themselves. Holes are recorded, never read or compressed.

// dataExtents lists a file's data and its total. ok is false when the file has no hole
// worth recording (or the file system cannot say), in which case it is
// archived as a plain file.
func dataExtents(fd int, size int64) (exts []fsops.Extent, data int64, ok bool) {
	exts, err := fsops.DataExtents(fd, 0, size)
	if err != nil {
		return nil, 0, false
	}
	for _, e := range exts {
		data += e.Length
	}
	// A file that is all data, or whose holes save less than a block,
	// stays a plain entry: simpler for every reader.
	if size-data < 64<<10 {
		return nil, 0, false
	}
	// GNU sparse maps end with an extent at the end of the file.
	if len(exts) == 0 || exts[len(exts)-1].Offset+exts[len(exts)-1].Length < size {
		exts = append(exts, fsops.Extent{Offset: size})
	}
	return exts, data, true
}

func paxRecord(k, v string) string {
	size := len(k) + len(v) + 3 // ' ', '=', '\n'
	size += len(strconv.Itoa(size))
	if len(strconv.Itoa(size)) > len(strconv.Itoa(size-len(strconv.Itoa(size)))) {
		size++
	}
	return fmt.Sprintf("%d %s=%s\n", size, k, v)
}

func octal(b []byte, v int64) {
	s := strconv.FormatInt(v, 8)
	for len(s) < len(b)-1 {
		s = "0" + s
	}
	copy(b, s)
}

// ustarBlock builds one 512-byte ustar header.
func ustarBlock(name string, typ byte, mode, uid, gid, size int64, mtime time.Time) []byte {
	b := make([]byte, 512)
	if len(name) > 99 {
		name = name[len(name)-99:] // the real name is in the PAX header
	}
	copy(b[0:100], name)
	octal(b[100:108], mode)
	octal(b[108:116], uid&0o7777777)
	octal(b[116:124], gid&0o7777777)
	octal(b[124:136], size)
	octal(b[136:148], mtime.Unix())
	b[156] = typ
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	octal(b[148:155], sum)
	b[155] = ' '
	return b
}

func pad(w io.Writer, n int64) error {
	if r := n % 512; r != 0 {
		_, err := w.Write(make([]byte, 512-r))
		return err
	}
	return nil
}

// writeSparse writes one sparse regular file. w is the stream under the
// tar.Writer, which holds no state between entries once flushed.
func (a *writer) writeSparse(f *os.File, h *tar.Header, exts []fsops.Extent) error {
	if err := a.tw.Flush(); err != nil {
		return err
	}
	var m bytes.Buffer
	fmt.Fprintf(&m, "%d\n", len(exts))
	var data int64
	for _, e := range exts {
		fmt.Fprintf(&m, "%d\n%d\n", e.Offset, e.Length)
		data += e.Length
	}
	if r := m.Len() % 512; r != 0 {
		m.Write(make([]byte, 512-r))
	}
	stored := int64(m.Len()) + data
	recs := map[string]string{
		"GNU.sparse.major":    "1",
		"GNU.sparse.minor":    "0",
		"GNU.sparse.name":     h.Name,
		"GNU.sparse.realsize": strconv.FormatInt(h.Size, 10),
		"size":                strconv.FormatInt(stored, 10),
		"mtime":               fmt.Sprintf("%d.%09d", h.ModTime.Unix(), h.ModTime.Nanosecond()),
		"uid":                 strconv.Itoa(h.Uid),
		"gid":                 strconv.Itoa(h.Gid),
	}
	for k, v := range h.PAXRecords {
		recs[k] = v
	}
	if m := sparseMapRecord(exts); m != "" {
		recs[sparseMapKey] = m
	}
	keys := make([]string, 0, len(recs))
	for k := range recs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var pax bytes.Buffer
	for _, k := range keys {
		pax.WriteString(paxRecord(k, recs[k]))
	}
	dir, file := path.Split(h.Name)
	w := a.raw
	if _, err := w.Write(ustarBlock(path.Join(dir, "PaxHeaders.0", file), tar.TypeXHeader, 0o644, 0, 0, int64(pax.Len()), h.ModTime)); err != nil {
		return err
	}
	if _, err := w.Write(pax.Bytes()); err != nil {
		return err
	}
	if err := pad(w, int64(pax.Len())); err != nil {
		return err
	}
	if _, err := w.Write(ustarBlock(path.Join(dir, "GNUSparseFile.0", file), tar.TypeReg, h.Mode, int64(h.Uid), int64(h.Gid), stored, h.ModTime)); err != nil {
		return err
	}
	if _, err := w.Write(m.Bytes()); err != nil {
		return err
	}
	for _, e := range exts {
		n, err := io.CopyBuffer(w, io.NewSectionReader(f, e.Offset, e.Length), a.buf)
		if err != nil {
			return err
		}
		if n < e.Length { // file shrank while archived: keep the stream valid
			if _, err := io.CopyBuffer(w, io.LimitReader(zeroReader{}, e.Length-n), a.buf); err != nil {
				return err
			}
		}
	}
	return pad(w, stored)
}
