// Package faultfs mounts a FUSE file system that passes everything through
// to a directory, except reads, writes or syncs a test has chosen to fail with
// EIO: real I/O errors, from the kernel, for the driver's fault tests. It
// stands in for device-mapper's error and flakey targets, which the test
// machines' kernel lacks. For tests only.
package faultfs

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// Op is what a fault breaks.
type Op int

// The operations a fault can break.
const (
	Read Op = iota
	Write
	// Sync is fsync(2) and fdatasync(2); its fault ignores After.
	Sync
)

// Fault makes matching reads or writes fail with EIO: those of files whose
// path (relative to the mount) satisfies Match, at offsets from After on.
type Fault struct {
	Op    Op
	Match func(path string) bool
	After int64
}

// FS is a mounted fault-injecting file system.
type FS struct {
	// Dir is where it is mounted.
	Dir string

	mu     sync.Mutex
	faults []Fault
	hits   int
}

// Mount makes a fault file system showing backing at a new directory
// mnt, unmounted in t.Cleanup (after the test's own cleanups, which may
// hold mounts on top of it).
func Mount(t *testing.T, backing, mnt string) *FS {
	t.Helper()
	testutil.RequireRoot(t)
	f := &FS{Dir: mnt}
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		t.Fatal(err)
	}
	root := &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	// Every node below the root is wrapped by its parent (WrapChild).
	rootNode := &node{LoopbackNode: &fs.LoopbackNode{RootData: root}, fs: f}
	root.RootNode = rootNode
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	zero := time.Duration(0)
	server, err := fs.Mount(mnt, rootNode, &fs.Options{
		MountOptions: fuse.MountOptions{DirectMount: true, AllowOther: true, FsName: "faultfs", Name: "faultfs"},
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
	})
	if err != nil {
		t.Fatalf("mounting faultfs at %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		testutil.UnmountUnder(t, mnt+"/")
		if err := server.Unmount(); err != nil {
			if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmounting faultfs at %s: %v", mnt, err)
			}
		}
	})
	return f
}

// Inject adds a fault; Clear removes them all.
func (f *FS) Inject(flt Fault) {
	f.mu.Lock()
	f.faults = append(f.faults, flt)
	f.mu.Unlock()
}

// Clear removes every fault.
func (f *FS) Clear() {
	f.mu.Lock()
	f.faults = nil
	f.mu.Unlock()
}

// Hits is how many operations failed by injection so far.
func (f *FS) Hits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits
}

func (f *FS) fail(op Op, path string, off int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, flt := range f.faults {
		if flt.Op == op && off >= flt.After && flt.Match(path) {
			f.hits++
			return true
		}
	}
	return false
}

// node is a loopback node whose files go through fault checks.
type node struct {
	*fs.LoopbackNode
	fs *FS
}

// WrapChild makes each node the loopback creates under n a fault node.
func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if ln, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: ln, fs: n.fs}
	}
	return ops
}

func (n *node) path() string { return filepath.Clean("/" + n.EmbeddedInode().Path(nil)) }

func (n *node) wrap(fh fs.FileHandle, path string) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &file{LoopbackFile: lf, fs: n.fs, path: path}
	}
	return fh
}

// Open wraps the file for fault checks.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.wrap(fh, n.path()), fl, 0
}

// Create wraps the new file for fault checks.
func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return in, n.wrap(fh, filepath.Join(n.path(), name)), fl, 0
}

// file is a loopback file whose reads and writes can fail. Being another
// type, it also turns FUSE's copy_file_range down (ENOTSUP), so copies
// read and write through it.
type file struct {
	*fs.LoopbackFile
	fs   *FS
	path string
}

// Read fails with EIO where a fault says so.
func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.fs.fail(Read, f.path, off) {
		return nil, syscall.EIO
	}
	return f.LoopbackFile.Read(ctx, buf, off)
}

// Write fails with EIO where a fault says so.
func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if f.fs.fail(Write, f.path, off) {
		return 0, syscall.EIO
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

// Fsync fails with EIO where a fault says so: the write went through to
// the backing file, as a sync that fails after the kernel took the pages
// leaves it.
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if f.fs.fail(Sync, f.path, 0) {
		return syscall.EIO
	}
	return f.LoopbackFile.Fsync(ctx, flags)
}

// PassthroughFd turns FUSE passthrough down: with it the kernel would
// read and write the backing file itself, and no fault could be injected.
func (f *file) PassthroughFd() (int, bool) { return -1, false }
