package loop

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

func backingFile(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

func attach(t *testing.T, path string, opts Options) Device {
	t.Helper()
	d, err := Attach(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Detach(d) })
	return d
}

func TestAttachFindResizeDetach(t *testing.T) {
	testutil.RequireRoot(t)
	p := backingFile(t, 1<<20)
	d := attach(t, p, Options{})
	if size, err := Size(d.Path()); err != nil || size != 1<<20 {
		t.Fatalf("size %d %v", size, err)
	}
	found, ok, err := Find(p)
	if err != nil || !ok || found != d {
		t.Fatalf("Find: %+v %v %v, want %+v", found, ok, err, d)
	}
	if bf, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(d.Path()), "loop", "backing_file")); string(bf) != p+"\n" {
		t.Fatalf("sysfs backing_file %q", bf)
	}
	if err := os.Truncate(p, 3<<20); err != nil {
		t.Fatal(err)
	}
	if err := Resize(d); err != nil {
		t.Fatal(err)
	}
	if size, _ := Size(d.Path()); size != 3<<20 {
		t.Fatalf("after resize %d", size)
	}
	if err := Detach(d); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := Find(p); ok {
		t.Fatal("still attached after Detach")
	}
	if err := Detach(d); err != nil {
		t.Fatalf("second detach: %v", err)
	}
}

func TestAttachOptions(t *testing.T) {
	testutil.RequireRoot(t)
	// Autoclear: the device goes when its last user closes it, and
	// Attach closes its own handle, so nothing stays bound.
	p := backingFile(t, 1<<20)
	attach(t, p, Options{Autoclear: true})
	if _, ok, _ := Find(p); ok {
		t.Fatal("autoclear device still bound with no users")
	}
	d := attach(t, backingFile(t, 1<<20), Options{ReadOnly: true})
	info, err := Status(d)
	if err != nil {
		t.Fatal(err)
	}
	if info.Flags&unix.LO_FLAGS_READ_ONLY == 0 {
		t.Fatalf("flags %x", info.Flags)
	}
	f, err := os.OpenFile(d.Path(), os.O_WRONLY, 0)
	if err == nil {
		_, err = f.Write(make([]byte, 512))
		f.Close()
	}
	if !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM) {
		t.Fatalf("write to read-only device: %v", err)
	}
	// BlockSize: the device's logical sectors, 512 unless asked.
	for _, want := range []uint32{0, 4096} {
		d := attach(t, backingFile(t, 1<<20), Options{BlockSize: want})
		f, err := os.Open(d.Path())
		if err != nil {
			t.Fatal(err)
		}
		got, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET)
		f.Close()
		if err != nil || uint32(got) != max(want, 512) {
			t.Fatalf("BlockSize %d: logical block size %d (%v)", want, got, err)
		}
	}
}

func TestAttachMissingFileLeavesNothing(t *testing.T) {
	testutil.RequireRoot(t)
	// Other packages' tests attach devices meanwhile: look for a device
	// bound to this path, not at the machine's count.
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := Attach(missing, Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v", err)
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range files {
		if b, _ := os.ReadFile(bf); strings.HasPrefix(strings.TrimSpace(string(b)), missing) {
			t.Fatalf("a failed attach left %s bound to %s", bf, b)
		}
	}
}

// TestConcurrentAttach races many attaches for the same free device; each
// must end up on its own device.
func TestConcurrentAttach(t *testing.T) {
	testutil.RequireRoot(t)
	const n = 12
	var wg sync.WaitGroup
	devs := make([]Device, n)
	errs := make([]error, n)
	paths := make([]string, n)
	for i := range paths {
		paths[i] = backingFile(t, 1<<20)
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			devs[i], errs[i] = Attach(paths[i], Options{})
		}(i)
	}
	wg.Wait()
	seen := map[int]bool{}
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			t.Errorf("attach %d: %v", i, errs[i])
			continue
		}
		d := devs[i]
		t.Cleanup(func() { Detach(d) })
		if seen[d.Number] {
			t.Errorf("device %d handed out twice", d.Number)
		}
		seen[d.Number] = true
		if found, ok, _ := Find(paths[i]); !ok || found.Number != d.Number {
			t.Errorf("file %d is on %v, Attach said %d", i, found, d.Number)
		}
	}
}
