package bench

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/loop"
)

// benchFS is a file system the suite runs on: the machine's own (ext4
// here) and loop-mounted XFS (reflink=1) and btrfs images it makes and
// removes.
type benchFS struct {
	name    string
	reflink bool
	dir     string
}

// poolDirectIO binds the pool images' loop devices with direct I/O, so a
// pool's reads and writes reach the disk under this machine's root file
// system instead of its page cache: a pool on a disk, as a node has one,
// rather than in memory.
var poolDirectIO = flag.Bool("bench.pooldio", false, "bind the pool file systems' loop devices with direct I/O (a pool on the disk, not in the page cache)")

var (
	fsOnce  sync.Once
	fsList  []*benchFS
	fsErr   error
	cleanup []func()
)

func TestMain(m *testing.M) {
	// The driver's log lines (hcsi.New logs the kernel at start) would
	// land inside the result lines on the same terminal and break them
	// for benchreport: a case whose line is broken is no result.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	code := m.Run()
	for i := len(cleanup) - 1; i >= 0; i-- {
		cleanup[i]()
	}
	os.Exit(code)
}

func fileSystems(b *testing.B) []*benchFS {
	fsOnce.Do(func() { fsList, fsErr = makeFileSystems() })
	if fsErr != nil {
		b.Fatal(fsErr)
	}
	return fsList
}

func makeFileSystems() ([]*benchFS, error) {
	root, err := os.MkdirTemp("", "hostpath-bench-")
	if err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { os.RemoveAll(root) })
	// Every file system is a fresh image: users' ext4 has a journal
	// (this runner's root has none), and a fresh one has not been slowed
	// by earlier mass deletes. Inode tables and journal are written at
	// mkfs time, so no background init competes with the runs.
	var out []*benchFS
	// Sparse: room for the data sets' copies, BenchmarkBlockCreateAPI's
	// 1 GiB volumes and BenchmarkImageFormat's 10 GiB fallocate, whatever
	// -bench.size is.
	imgSize := max(int64(*sizeMiB)*12<<20+1<<30, 12<<30)
	for _, fs := range []struct {
		name    string
		mkfs    []string
		reflink bool
	}{
		{"ext4", []string{"mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"}, false},
		{"xfs", []string{"mkfs.xfs", "-q", "-m", "reflink=1"}, true},
		{"btrfs", []string{"mkfs.btrfs", "-q"}, true},
	} {
		if !have(fs.mkfs[0]) {
			// A machine without xfsprogs or btrfs-progs still measures
			// what it can (make deps installs both).
			fmt.Fprintf(os.Stderr, "bench: %s is not installed: skipping the %s runs\n", fs.mkfs[0], fs.name)
			continue
		}
		img := filepath.Join(root, fs.name+".img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			return nil, err
		}
		if err := os.Truncate(img, imgSize); err != nil {
			return nil, err
		}
		if out, err := exec.Command(fs.mkfs[0], append(fs.mkfs[1:], img)...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%v: %w %s", fs.mkfs, err, out)
		}
		dev, err := loop.Attach(img, loop.Options{DirectIO: *poolDirectIO})
		if err != nil {
			return nil, err
		}
		if *poolDirectIO && !dev.DirectIO {
			return nil, fmt.Errorf("-bench.pooldio: %s's loop device was refused direct I/O", img)
		}
		cleanup = append(cleanup, func() { loop.Detach(dev) })
		mnt := filepath.Join(root, fs.name)
		os.Mkdir(mnt, 0o755)
		if err := unix.Mount(dev.Path(), mnt, fs.name, 0, ""); err != nil {
			return nil, fmt.Errorf("mount %s: %w", fs.name, err)
		}
		cleanup = append(cleanup, func() { unix.Unmount(mnt, unix.MNT_DETACH) })
		out = append(out, &benchFS{name: fs.name, reflink: fs.reflink, dir: mnt})
	}
	return out, nil
}

// source returns the data set on fs, generating it once.
var sources sync.Map

func source(b *testing.B, fs *benchFS, ds dataSet) (string, int64) {
	key := fs.name + "/" + ds.name
	if v, ok := sources.Load(key); ok {
		s := v.(srcInfo)
		return s.dir, s.size
	}
	dir := filepath.Join(fs.dir, "src-"+ds.name)
	b.StopTimer()
	size := generate(b, ds, dir, int64(*sizeMiB)<<20)
	syncFS(dir)
	b.StartTimer()
	sources.Store(key, srcInfo{dir, size})
	return dir, size
}

type srcInfo struct {
	dir  string
	size int64
}

// outDir is a fresh directory for one run's output. Outputs are removed
// when the benchmark ends, not between runs: on this machine's
// journal-less ext4, file creation slows for minutes after mass deletes,
// and that is not what is being measured.
var outSeq int

func outDir(b *testing.B, fs *benchFS, what string) string {
	outSeq++
	d := filepath.Join(fs.dir, fmt.Sprintf("out-%s-%d", what, outSeq))
	if err := os.MkdirAll(d, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func syncFS(dir string) {
	if f, err := os.Open(dir); err == nil {
		unix.Syncfs(int(f.Fd()))
		f.Close()
	}
}

func run(b *testing.B, name string, args ...string) {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func have(tool string) bool {
	_, err := exec.LookPath(tool)
	return err == nil
}
