package archive

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
)

// DefaultLevel is the gzip level snapshots use: gzip -6, the level tar czf
// uses, so archives are the size users expect.
const DefaultLevel = 6

// Stats counts what was archived or extracted.
type Stats struct {
	Files, Dirs, Symlinks, Special, Hardlinks int64
	SkippedSockets                            int64
	// SkippedDevices are the device nodes ExtractUntrusted left out.
	SkippedDevices int64
	Bytes          int64 // regular file content, holes included
	// DataBytes is the content without holes: the room a restore needs.
	DataBytes int64
}

const xattrPrefix = "SCHILY.xattr."

// Options choose the compression of Write.
type Options struct {
	// Level is the gzip level; 0 means DefaultLevel.
	Level int
	// Compact trades speed for size: the standard library's deflate,
	// whose archives are within about 1% of gzip -6, instead of
	// klauspost's, which is several times faster and about 4% larger on
	// text. Both use every core.
	Compact bool
	// Zstd writes tar.zst instead of tar.gz: zstd level 3 (the zstd
	// CLI's default) on every core, one frame per 8 MiB block. Extract
	// tells the two apart by their magic numbers.
	Zstd bool
}

// Write streams a tar.gz (or tar.zst) of the tree below dir into w,
// compressing on all cores in bounded memory.
func Write(ctx context.Context, dir string, w io.Writer, opts Options) (Stats, error) {
	level := opts.Level
	if level == 0 {
		level = DefaultLevel
	}
	var f blockFormat = &gzipMembers{level: level, compact: opts.Compact}
	block := gzBlock
	if opts.Zstd {
		z, err := newZstdFrames(zstd.SpeedDefault)
		if err != nil {
			return Stats{}, err
		}
		defer z.enc.Close()
		f, block = z, zstdBlock
	}
	gz := newParallelWriter(w, f, block)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		gz.Close()
		return Stats{}, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	// A Progress in ctx counts the tar stream (content and headers) as it
	// goes into the compressor, and the files.
	pr := fsops.ProgressFrom(ctx)
	pw := fsops.ProgressWriter{W: gz, P: pr}
	aw := &writer{ctx: ctx, raw: pw, tw: tar.NewWriter(pw), progress: pr, links: map[[2]uint64]string{}, buf: make([]byte, 1<<20)}
	err = aw.root(fd)
	if err == nil {
		err = aw.tw.Close()
	}
	if cerr := gz.Close(); err == nil {
		err = cerr
	}
	return aw.stats, err
}

type writer struct {
	ctx      context.Context
	raw      io.Writer // the stream under tw, for entries tw cannot write
	tw       *tar.Writer
	progress *fsops.Progress
	stats    Stats
	links    map[[2]uint64]string
	buf      []byte
}

func (a *writer) root(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return &os.PathError{Op: "fstat", Path: ".", Err: err}
	}
	x, err := fsops.ListXattrs(fd)
	if err != nil {
		unix.Close(fd)
		return err
	}
	if err := a.tw.WriteHeader(header("./", tar.TypeDir, &st, x)); err != nil {
		unix.Close(fd)
		return err
	}
	return a.dir(fd, "")
}

// dir archives the entries of the open directory fd and closes it.
func (a *writer) dir(fd int, rel string) error {
	defer unix.Close(fd)
	names, err := fsops.ReadDirNames(fd)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := a.ctx.Err(); err != nil {
			return err
		}
		if err := a.entry(fd, rel, name); err != nil {
			return err
		}
	}
	return nil
}

// header describes an entry. Access times are left out, as tar does: every
// one would cost a PAX record and they say little about the data; a restore
// sets atime to mtime.
func header(name string, typ byte, st *unix.Stat_t, xattrs map[string][]byte) *tar.Header {
	h := &tar.Header{
		Typeflag: typ,
		Name:     name,
		Mode:     int64(st.Mode & 0o7777),
		Uid:      int(st.Uid),
		Gid:      int(st.Gid),
		ModTime:  time.Unix(st.Mtim.Unix()),
		Format:   tar.FormatPAX,
	}
	if len(xattrs) > 0 {
		h.PAXRecords = map[string]string{}
		for k, v := range xattrs {
			h.PAXRecords[xattrPrefix+k] = string(v)
		}
	}
	return h
}

func (a *writer) entry(dirfd int, rel, name string) error {
	p := path.Join(rel, name)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return &os.PathError{Op: "fstatat", Path: p, Err: err}
	}
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := a.links[key]; ok {
			h := header(p, tar.TypeLink, &st, nil)
			h.Linkname = first
			a.stats.Hardlinks++
			return a.tw.WriteHeader(h)
		}
		a.links[key] = p
	}
	switch kind {
	case unix.S_IFDIR:
		sub, err := fsops.OpenDirAt(dirfd, name)
		if err != nil {
			return err
		}
		x, err := fsops.ListXattrs(sub)
		if err != nil {
			unix.Close(sub)
			return err
		}
		if err := a.tw.WriteHeader(header(p+"/", tar.TypeDir, &st, x)); err != nil {
			unix.Close(sub)
			return err
		}
		a.stats.Dirs++
		return a.dir(sub, p)
	case unix.S_IFREG:
		return a.file(dirfd, name, p, &st)
	case unix.S_IFLNK:
		target, err := fsops.ReadlinkAt(dirfd, name)
		if err != nil {
			return &os.PathError{Op: "readlinkat", Path: p, Err: err}
		}
		h := header(p, tar.TypeSymlink, &st, nil)
		h.Linkname = target
		a.stats.Symlinks++
		return a.tw.WriteHeader(h)
	case unix.S_IFIFO, unix.S_IFCHR, unix.S_IFBLK:
		typ := map[uint32]byte{unix.S_IFIFO: tar.TypeFifo, unix.S_IFCHR: tar.TypeChar, unix.S_IFBLK: tar.TypeBlock}[kind]
		h := header(p, typ, &st, nil)
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		a.stats.Special++
		return a.tw.WriteHeader(h)
	case unix.S_IFSOCK:
		a.stats.SkippedSockets++
	}
	return nil
}

func (a *writer) file(dirfd int, name, p string, st *unix.Stat_t) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return &os.PathError{Op: "openat", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Ino != st.Ino || st2.Dev != st.Dev {
		return &os.PathError{Op: "open", Path: p, Err: unix.ESTALE} // swapped since fstatat
	}
	x, err := fsops.ListXattrs(fd)
	if err != nil {
		return err
	}
	h := header(p, tar.TypeReg, &st2, x)
	h.Size = st2.Size
	if exts, data, ok := dataExtents(fd, h.Size); ok {
		if err := a.writeSparse(f, h, exts); err != nil {
			return fmt.Errorf("archiving %s: %w", p, err)
		}
		a.stats.Files++
		a.progress.AddFiles(1)
		a.stats.Bytes += h.Size
		a.stats.DataBytes += data
		return nil
	}
	if err := a.tw.WriteHeader(h); err != nil {
		return err
	}
	// The file may shrink while we read it; the header promised Size
	// bytes, so pad with zeros rather than write a broken archive.
	// pread from offset 0: dataExtents moved the file offset.
	n, err := io.CopyBuffer(a.tw, io.NewSectionReader(f, 0, h.Size), a.buf)
	if err != nil {
		return fmt.Errorf("archiving %s: %w", p, err)
	}
	if n < h.Size {
		if _, err := io.CopyBuffer(a.tw, io.LimitReader(zeroReader{}, h.Size-n), a.buf); err != nil {
			return err
		}
	}
	a.stats.Files++
	a.progress.AddFiles(1)
	a.stats.Bytes += h.Size
	a.stats.DataBytes += h.Size
	return nil
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}
