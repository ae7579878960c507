package fsops

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopySymlinkSwapRace: while the tree is copied again and again, a
// "pod" keeps swapping a directory for a symlink to a host directory. The
// copy may fail or copy the symlink, but a host file never appears in it.
func TestCopySymlinkSwapRace(t *testing.T) {
	base := t.TempDir()
	host := filepath.Join(base, "host")
	os.Mkdir(host, 0o755)
	secret := []byte("host secret " + strings.Repeat("s", 100))
	os.WriteFile(filepath.Join(host, "secret"), secret, 0o600)
	src := filepath.Join(base, "vol")
	os.MkdirAll(filepath.Join(src, "d"), 0o755)
	os.WriteFile(filepath.Join(src, "d", "secret"), []byte("pod data"), 0o644)

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			tmp := filepath.Join(src, "tmp")
			if i%2 == 0 {
				os.Symlink(host, tmp)
			} else {
				os.MkdirAll(filepath.Join(tmp), 0o755)
				os.WriteFile(filepath.Join(tmp, "secret"), []byte("pod data"), 0o644)
			}
			unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, filepath.Join(src, "d"), unix.RENAME_EXCHANGE)
			RemoveAll(tmp)
		}
	}()
	copies := 0
	for i := 0; i < 200; i++ {
		dst := filepath.Join(base, "copy", strings.Repeat("x", 1+i%5)+string(rune('a'+i%26))+filepath.Base(t.Name())+"-"+string(rune('A'+i/26)))
		os.MkdirAll(dst, 0o755)
		if _, err := CopyTree(context.Background(), src, dst); err == nil {
			copies++
		}
		filepath.Walk(dst, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				if b, _ := os.ReadFile(p); bytes.Equal(b, secret) {
					t.Fatalf("host file copied into %s", p)
				}
			}
			return nil
		})
		RemoveAll(dst)
	}
	stop.Store(true)
	wg.Wait()
	if copies == 0 {
		t.Fatal("no copy succeeded at all")
	}
}

// TestHostileTrees: 255-byte names, a 4,000-deep tree, fifos and sockets
// are copied or fail cleanly, never hang.
func TestHostileTrees(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	os.Mkdir(src, 0o755)
	long := strings.Repeat("n", 255)
	os.WriteFile(filepath.Join(src, long), []byte("x"), 0o644)
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o644) // opening it would block a naive copier
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4000; i++ {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	dst := filepath.Join(base, "dst")
	os.Mkdir(dst, 0o755)
	st, err := CopyTree(context.Background(), src, dst)
	if err != nil {
		t.Fatalf("copying a 4,000-deep tree: %v", err)
	}
	if st.Dirs != 4000 || st.Special != 1 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dst, long)); err != nil {
		t.Fatal("255-byte name lost")
	}
	if err := RemoveAll(dst); err != nil {
		t.Fatalf("removing a 4,000-deep tree: %v", err)
	}
	if err := RemoveAll(src); err != nil {
		t.Fatal(err)
	}
}
