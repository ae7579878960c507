package fsops

import (
	"context"
	"fmt"
	"os"
	"path"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// CopyStats counts what CopyTree did.
type CopyStats struct {
	Files, Dirs, Symlinks, Special, Hardlinks int64
	// SkippedSockets are sockets found in the source: they cannot be
	// copied (a socket belongs to a running process) and are left out.
	SkippedSockets int64
	Bytes          int64 // logical size of the regular files copied
	Reflinked      int64 // files whose data was shared by FICLONE
}

// copyWorkers bounds the goroutines (and so the open file pairs) that copy
// file data. Small files are dominated by syscalls, which overlap well.
func copyWorkers() int { return max(2, runtime.GOMAXPROCS(0)) }

type fileJob struct {
	src, dst int
	size     int64
	dense    bool // no holes: blocks cover the size
	meta     Meta
	xattrs   map[string][]byte
	name     string
}

type treeCopier struct {
	ctx      context.Context
	uid, gid uint32 // who new files belong to
	dstRoot  int
	probe    copyProbe
	progress *Progress // from ctx (WithProgress), or nil
	stats    CopyStats
	links    map[[2]uint64]string // source inode -> destination path
	jobs     chan fileJob
	wg       sync.WaitGroup
	errOnce  sync.Once
	err      error
	failed   atomic.Bool
}

func (c *treeCopier) fail(err error) {
	c.errOnce.Do(func() { c.err = err; c.failed.Store(true) })
}

// CopyTree copies the tree below src into the existing empty directory dst:
// file types (regular, directory, symlink, fifo, device nodes; sockets are
// skipped and counted), mode bits with setuid/setgid/sticky, owners,
// nanosecond times (a directory's after its contents), extended attributes
// (ACLs and capabilities too), hard links as hard links, and holes. File
// data moves by reflink, copy_file_range or read/write, whichever the file
// systems allow, in a bounded pool of workers.
//
// Every step is fd-relative and never follows a symlink: a source entry
// that is swapped for a symlink mid-copy is copied as that symlink or makes
// the copy fail, and never leads the copy out of src. A Progress in ctx
// (WithProgress) counts the bytes and files as they are copied.
func CopyTree(ctx context.Context, src, dst string) (CopyStats, error) {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return CopyStats{}, &os.PathError{Op: "open", Path: src, Err: err}
	}
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(sfd)
		return CopyStats{}, &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(dfd)
	c := &treeCopier{ctx: ctx, progress: ProgressFrom(ctx), uid: uint32(os.Geteuid()), gid: uint32(os.Getegid()), dstRoot: dfd, links: map[[2]uint64]string{}, jobs: make(chan fileJob, 64)}
	for i := 0; i < copyWorkers(); i++ {
		c.wg.Add(1)
		go c.worker()
	}
	var rootSt unix.Stat_t
	walkErr := unix.Fstat(sfd, &rootSt)
	if walkErr == nil {
		rootX, xerr := ListXattrs(sfd)
		walkErr = xerr
		if walkErr == nil {
			walkErr = c.copyDir(sfd, dfd, "")
		}
		if walkErr == nil {
			walkErr = SetXattrs(dfd, rootX)
		}
	} else {
		unix.Close(sfd)
	}
	close(c.jobs)
	c.wg.Wait()
	if walkErr != nil {
		return c.stats, walkErr
	}
	if c.err != nil {
		return c.stats, c.err
	}
	if err := ApplyMetaFD(dfd, MetaOf(&rootSt), nil); err != nil {
		return c.stats, err
	}
	return c.stats, nil
}

func (c *treeCopier) worker() {
	defer c.wg.Done()
	buf := make([]byte, sparseChunk)
	for j := range c.jobs {
		if !c.failed.Load() {
			if err := c.copyFile(j, buf); err != nil {
				c.fail(err)
			}
		}
		unix.Close(j.src)
		unix.Close(j.dst)
	}
}

func (c *treeCopier) copyFile(j fileJob, buf []byte) error {
	m, err := c.probe.copyData(c.ctx, j.dst, j.src, j.size, j.dense, buf, c.progress)
	if err != nil {
		return fmt.Errorf("copying %s: %w", j.name, err)
	}
	c.progress.AddFiles(1)
	if m == CopyReflink {
		atomic.AddInt64(&c.stats.Reflinked, 1)
	}
	// The file was created with its final permission bits by this
	// process: owner and mode calls are needed only if they differ.
	have := unix.Stat_t{Uid: c.uid, Gid: c.gid, Mode: CreatedMode(j.meta.Mode & 0o777)}
	if err := ApplyMetaFD(j.dst, j.meta, &have); err != nil {
		return fmt.Errorf("copying %s: %w", j.name, err)
	}
	// Extended attributes after the owner: chown clears
	// security.capability. Setting them leaves mtime alone.
	if err := SetXattrs(j.dst, j.xattrs); err != nil {
		return fmt.Errorf("copying %s: %w", j.name, err)
	}
	return nil
}

// copyDir copies the entries of the open source directory sfd into the open
// destination directory dfd; rel is the directory's path below the root.
// It closes sfd.
func (c *treeCopier) copyDir(sfd, dfd int, rel string) error {
	defer unix.Close(sfd)
	names, err := ReadDirNames(sfd)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if c.failed.Load() {
			return nil
		}
		if err := c.copyEntry(sfd, dfd, rel, name); err != nil {
			return err
		}
	}
	return nil
}

func (c *treeCopier) copyEntry(sfd, dfd int, rel, name string) error {
	p := path.Join(rel, name)
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil // removed while we walked
		}
		return &os.PathError{Op: "fstatat", Path: p, Err: err}
	}
	meta := MetaOf(&st)
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := c.links[key]; ok {
			dir, base := path.Split(first)
			fd, err := OpenBeneathLong(c.dstRoot, path.Clean(dir), unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				return err
			}
			err = unix.Linkat(fd, base, dfd, name, 0)
			unix.Close(fd)
			if err != nil {
				return &os.PathError{Op: "linkat", Path: p, Err: err}
			}
			c.stats.Hardlinks++
			return nil
		}
		c.links[key] = p
	}
	switch kind {
	case unix.S_IFDIR:
		sub, err := OpenDirAt(sfd, name)
		if err != nil {
			return err
		}
		if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
			unix.Close(sub)
			return &os.PathError{Op: "mkdirat", Path: p, Err: err}
		}
		dsub, err := OpenDirAt(dfd, name)
		if err != nil {
			unix.Close(sub)
			return err
		}
		defer unix.Close(dsub)
		x, err := ListXattrs(sub)
		if err != nil {
			unix.Close(sub)
			return err
		}
		if err := SetXattrs(dsub, x); err != nil {
			unix.Close(sub)
			return err
		}
		c.stats.Dirs++
		if err := c.copyDir(sub, dsub, p); err != nil {
			return err
		}
		// Every entry of the directory exists now (workers only fill in
		// file data), so its times can be set, through its descriptor:
		// a path from the root may be longer than PATH_MAX.
		if err := ApplyMetaFD(dsub, meta, nil); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	case unix.S_IFREG:
		s, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
		if err != nil {
			return &os.PathError{Op: "openat", Path: p, Err: err}
		}
		// The entry may have been swapped since fstatat: copy only the
		// inode that was checked.
		var st2 unix.Stat_t
		if err := unix.Fstat(s, &st2); err != nil || st2.Ino != st.Ino || st2.Dev != st.Dev {
			unix.Close(s)
			return &os.PathError{Op: "open", Path: p, Err: unix.ESTALE}
		}
		x, err := ListXattrs(s)
		if err != nil {
			unix.Close(s)
			return err
		}
		d, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, meta.Mode&0o777)
		if err != nil {
			unix.Close(s)
			return &os.PathError{Op: "openat", Path: p, Err: err}
		}
		c.stats.Files++
		c.stats.Bytes += st2.Size
		select {
		case c.jobs <- fileJob{src: s, dst: d, size: st2.Size, dense: st2.Blocks*512 >= st2.Size, meta: meta, xattrs: x, name: p}:
		case <-c.ctx.Done():
			unix.Close(s)
			unix.Close(d)
			return c.ctx.Err()
		}
		return nil
	case unix.S_IFLNK:
		target, err := ReadlinkAt(sfd, name)
		if err != nil {
			return &os.PathError{Op: "readlinkat", Path: p, Err: err}
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return &os.PathError{Op: "symlinkat", Path: p, Err: err}
		}
		c.stats.Symlinks++
		return ApplyMeta(dfd, name, meta, true)
	case unix.S_IFIFO, unix.S_IFCHR, unix.S_IFBLK:
		if err := unix.Mknodat(dfd, name, kind|0o600, int(st.Rdev)); err != nil {
			return &os.PathError{Op: "mknodat", Path: p, Err: err}
		}
		c.stats.Special++
		return ApplyMeta(dfd, name, meta, false)
	case unix.S_IFSOCK:
		c.stats.SkippedSockets++
		return nil
	}
	return nil
}

// ReadlinkAt reads a symlink's target relative to dirfd, growing the buffer
// for long targets.
func ReadlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}
