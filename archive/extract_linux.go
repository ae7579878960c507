package archive

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/mholt/archives"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
)

// Extract restores a tar.gz stream into the existing directory dir:
// regular files (with holes where the data is zero), directories, symlinks,
// hard links, fifos and device nodes, with owners, modes, nanosecond times
// (directories' after their contents) and extended attributes.
//
// Every entry is created through a parent opened with openat2 beneath dir
// without crossing a symlink, and names that are absolute or contain ".."
// are refused, so nothing is written outside dir whatever the archive
// holds. A corrupt or truncated stream gives an error wrapping ErrFormat.
func Extract(ctx context.Context, r io.Reader, dir string) (Stats, error) {
	return extract(ctx, r, dir, false)
}

// ExtractUntrusted is Extract of an archive that another node served: a
// node taken could plant, in a volume restored for another tenant, a
// device node of the host's disk or a setuid-root program. So device
// nodes are left out (counted in SkippedDevices), setuid and setgid bits
// are cleared, and file capabilities (the security.capability extended
// attribute) are not restored.
func ExtractUntrusted(ctx context.Context, r io.Reader, dir string) (Stats, error) {
	return extract(ctx, r, dir, true)
}

func extract(ctx context.Context, r io.Reader, dir string, untrusted bool) (Stats, error) {
	gz, err := decompressor(r)
	if err != nil {
		return Stats{}, err
	}
	defer gz.Close()
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return Stats{}, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(root)
	x := newExtractor(root)
	x.ctx = ctx
	x.untrusted = untrusted
	x.progress = fsops.ProgressFrom(ctx)
	x.tap = &sparseTap{r: fsops.ProgressReader{R: gz, P: x.progress}}
	err = x.run(ctx, tar.NewReader(x.tap))
	x.closeParent()
	x.jobs.close()
	if err == nil {
		err = x.jobs.err()
	}
	if err != nil {
		return x.stats, err
	}
	// Read to the end of the gzip member: only there is its CRC checked,
	// and a flipped bit in file data is caught by nothing else.
	if _, err := io.Copy(io.Discard, gz); err != nil {
		return x.stats, formatErr(err)
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		fd, err := fsops.OpenBeneathLong(root, x.dirs[i].rel, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return x.stats, err
		}
		err = fsops.ApplyMetaFD(fd, x.dirs[i].meta, nil)
		unix.Close(fd)
		if err != nil {
			return x.stats, err
		}
	}
	return x.stats, nil
}

// decompressor reads a tar.gz or a tar.zst, told apart by the first
// bytes. The snapshots this driver writes are indexed (see blockFormat)
// and are decoded on every core; other streams, such as the snapshots of
// earlier versions, are read as one stream through mholt/archives. zstd
// checks each frame's checksum as it ends, gzip each member's CRC at its
// end.
func decompressor(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, _ := br.Peek(gzHeaderLen)
	var rc io.ReadCloser
	var err error
	switch {
	case isGzipMember(head):
		return newParallelReader(br, &gzipMembers{}, gzBlock), nil
	case isZstdUnit(head):
		z, err := newZstdDecoder()
		if err != nil {
			return nil, err
		}
		return newParallelReader(br, z, zstdBlock), nil
	case bytes.HasPrefix(head, zstdMagic):
		rc, err = archives.Zstd{DecoderOptions: []zstd.DOption{
			zstd.WithDecoderConcurrency(0), // GOMAXPROCS
			zstd.WithDecoderMaxWindow(64 << 20),
		}}.OpenReader(br)
	default:
		rc, err = archives.Gz{Multithreaded: true}.OpenReader(br)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	return rc, nil
}

// formatErr tags errors of the stream itself (bad gzip, bad tar, early
// end) as ErrFormat; errors of the file system keep their errno.
func formatErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrFormat, err)
}

type dirMeta struct {
	rel  string
	meta fsops.Meta
}

type extractor struct {
	root  int
	stats Stats
	dirs  []dirMeta
	jobs  *filePool
	// The parent directory of the last entry stays open: archives list a
	// directory's files together, so most entries reuse it.
	parentRel string
	parentRef *dirRef
	progress  *fsops.Progress // from ctx, or nil
	// ctx is checked per chunk of a large file too: a sparse file of
	// another tar, whose holes the tar reader hands over as zeros, may be
	// terabytes of them.
	ctx context.Context
	// untrusted: no device nodes, setuid or setgid bits, or file
	// capabilities (ExtractUntrusted).
	untrusted bool
	// tap is the stream under the tar reader: sparse entries the writer
	// mapped are read from it directly (sparse_read_linux.go).
	tap *sparseTap
}

func newExtractor(root int) *extractor {
	return &extractor{root: root, jobs: newFilePool()}
}

func (x *extractor) run(ctx context.Context, tr *tar.Reader) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := x.jobs.err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return formatErr(err)
		}
		if err := x.entry(h, tr); err != nil {
			return err
		}
	}
}

func (x *extractor) closeParent() {
	if x.parentRef != nil {
		x.parentRef.release()
		x.parentRef = nil
	}
}

// cleanName checks an entry name and returns it relative to the root.
func cleanName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: entry name contains NUL", ErrFormat)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: entry %q has an absolute name", ErrFormat, name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: entry %q leads out through a %q part", ErrFormat, name, "..")
		}
	}
	return path.Clean(name), nil
}

// parent opens the directory that will hold rel, beneath the root, and
// returns it with the entry's base name.
func (x *extractor) parent(rel string) (int, string, error) {
	dir, base := path.Split(rel)
	dir = path.Clean(dir)
	if x.parentRef != nil && x.parentRel == dir {
		return x.parentRef.fd, base, nil
	}
	x.closeParent()
	fd, err := fsops.OpenBeneathLong(x.root, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, "", err
	}
	x.parentRef, x.parentRel = newDirRef(fd), dir
	return fd, base, nil
}

// metaOf is an entry's owner, mode and times; untrusted, without setuid
// and setgid.
func (x *extractor) metaOf(h *tar.Header) fsops.Meta {
	m := metaOf(h)
	if x.untrusted {
		m.Mode &^= unix.S_ISUID | unix.S_ISGID
	}
	return m
}

// xattrsOf is an entry's extended attributes; untrusted, without file
// capabilities.
func (x *extractor) xattrsOf(h *tar.Header) map[string][]byte {
	m := xattrsOf(h)
	if x.untrusted {
		delete(m, "security.capability")
	}
	return m
}

func metaOf(h *tar.Header) fsops.Meta {
	ts := func(t time.Time) unix.Timespec {
		if t.IsZero() {
			t = h.ModTime
		}
		return unix.NsecToTimespec(t.UnixNano())
	}
	return fsops.Meta{Mode: uint32(h.Mode) & 0o7777, UID: h.Uid, GID: h.Gid, Atime: ts(h.AccessTime), Mtime: ts(h.ModTime)}
}

func xattrsOf(h *tar.Header) map[string][]byte {
	var out map[string][]byte
	for k, v := range h.PAXRecords {
		if name, ok := strings.CutPrefix(k, xattrPrefix); ok {
			if out == nil {
				out = map[string][]byte{}
			}
			out[name] = []byte(v)
		}
	}
	return out
}

func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	rel, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	meta := x.metaOf(h)
	if rel == "." {
		if h.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: root entry is not a directory", ErrFormat)
		}
		if err := fsops.SetXattrs(x.root, x.xattrsOf(h)); err != nil {
			return err
		}
		x.dirs = append(x.dirs, dirMeta{rel: ".", meta: meta})
		return nil
	}
	pfd, base, err := x.parent(rel)
	if err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && err != unix.EEXIST {
			return &os.PathError{Op: "mkdirat", Path: rel, Err: err}
		}
		fd, err := fsops.OpenDirAt(pfd, base)
		if err != nil {
			return err
		}
		err = fsops.SetXattrs(fd, x.xattrsOf(h))
		unix.Close(fd)
		if err != nil {
			return err
		}
		x.stats.Dirs++
		x.dirs = append(x.dirs, dirMeta{rel: rel, meta: meta})
		return nil
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // archives written before Go 1.11 and by old tars still carry TypeRegA
		return x.file(pfd, base, rel, h, r, meta)
	case tar.TypeSymlink:
		if err := x.replace(pfd, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return &os.PathError{Op: "symlinkat", Path: rel, Err: err}
		}
		x.stats.Symlinks++
		return fsops.ApplyMeta(pfd, base, meta, true)
	case tar.TypeLink:
		// The target may still be being written by a worker.
		x.jobs.wait()
		target, err := cleanName(h.Linkname)
		if err != nil {
			return err
		}
		// The link target is resolved beneath the root too, and linkat
		// without AT_SYMLINK_FOLLOW links the entry itself, never what a
		// symlink points to.
		tdir, tbase := path.Split(target)
		tfd, err := fsops.OpenBeneathLong(x.root, path.Clean(tdir), unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer unix.Close(tfd)
		if err := x.replace(pfd, base); err != nil {
			return err
		}
		if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
			return &os.PathError{Op: "linkat", Path: rel, Err: err}
		}
		x.stats.Hardlinks++
		return nil
	case tar.TypeFifo, tar.TypeChar, tar.TypeBlock:
		if x.untrusted && h.Typeflag != tar.TypeFifo {
			x.stats.SkippedDevices++
			return nil
		}
		mode := map[byte]uint32{tar.TypeFifo: unix.S_IFIFO, tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK}[h.Typeflag]
		if err := x.replace(pfd, base); err != nil {
			return err
		}
		dev := unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor))
		if err := unix.Mknodat(pfd, base, mode|0o600, int(dev)); err != nil {
			return &os.PathError{Op: "mknodat", Path: rel, Err: err}
		}
		x.stats.Special++
		return fsops.ApplyMeta(pfd, base, meta, false)
	case tar.TypeXGlobalHeader:
		return nil
	}
	return fmt.Errorf("%w: entry %q has unsupported type %q", ErrFormat, h.Name, h.Typeflag)
}

// replace removes a non-directory entry that an earlier entry of the same
// name left, as tar does; a directory is refused.
func (x *extractor) replace(pfd int, base string) error {
	if err := unix.Unlinkat(pfd, base, 0); err != nil && err != unix.ENOENT {
		return &os.PathError{Op: "unlinkat", Path: base, Err: err}
	}
	return nil
}

// smallFile is the size up to which a file is read into memory and
// written by a worker, so file creation (the cost of restoring many small
// files) runs on every core while the stream is decompressed.
const smallFile = 1 << 20

func (x *extractor) file(pfd int, base, rel string, h *tar.Header, r io.Reader, meta fsops.Meta) error {
	x.stats.Files++
	x.stats.Bytes += h.Size
	x.progress.AddFiles(1)
	if exts, ok := sparseMapOf(h); ok && x.tap != nil {
		// A sparse file the writer mapped: its extents read past the tar
		// reader, its holes never made (sparse_read_linux.go).
		return x.bigFile(pfd, base, rel, h, meta, exts, x.tap.take)
	}
	if h.Size <= smallFile {
		bp := x.jobs.buffer()
		data := (*bp)[:h.Size]
		if _, err := io.ReadFull(r, data); err != nil {
			x.jobs.put(bp)
			return formatErr(err)
		}
		x.parentRef.refs.Add(1)
		x.jobs.submit(fileJob{parent: x.parentRef, base: base, rel: rel, data: data, buf: bp, meta: meta, xattrs: x.xattrsOf(h)})
		return nil
	}
	whole := []fsops.Extent{{Offset: 0, Length: h.Size}}
	return x.bigFile(pfd, base, rel, h, meta, whole, func(b []byte) error {
		_, err := io.ReadFull(r, b)
		return err
	})
}

// bigFile writes a large file's data ranges, each filled by read in
// chunks: this goroutine only moves data from the stream into buffers;
// workers write the chunks. The file is cut to its size at the end (a
// sparse file's last hole).
func (x *extractor) bigFile(pfd int, base, rel string, h *tar.Header, meta fsops.Meta, ranges []fsops.Extent, read func([]byte) error) error {
	fd, err := createFile(pfd, base, rel, meta.Mode)
	if err != nil {
		return err
	}
	f := &bigFile{fd: fd, rel: rel, size: h.Size, meta: meta, xattrs: x.xattrsOf(h)}
	f.refs.Store(1)
	defer x.jobs.releaseFile(f)
	for _, e := range ranges {
		for off := int64(0); off < e.Length; off += smallFile {
			if err := x.ctx.Err(); err != nil {
				return err
			}
			bp := x.jobs.buffer()
			data := (*bp)[:min(smallFile, e.Length-off)]
			if err := read(data); err != nil {
				x.jobs.put(bp)
				return formatErr(err)
			}
			f.refs.Add(1)
			x.jobs.submit(fileJob{file: f, off: e.Offset + off, data: data, buf: bp})
		}
	}
	return nil
}

// createFile creates rel (base in the open directory pfd) for writing,
// replacing a non-directory an earlier entry of the same name left.
func createFile(pfd int, base, rel string, mode uint32) (int, error) {
	for try := 0; ; try++ {
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode&0o777)
		if err == unix.EEXIST && try == 0 {
			if err := unix.Unlinkat(pfd, base, 0); err != nil {
				return -1, &os.PathError{Op: "unlinkat", Path: rel, Err: err}
			}
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "openat", Path: rel, Err: err}
		}
		return fd, nil
	}
}
