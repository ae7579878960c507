package fsops

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestOpenUntimed: on XFS a file opened by handle takes writes that leave
// its mtime and ctime alone, and holds what was written; on ext4 the call
// says EOPNOTSUPP.
func TestOpenUntimed(t *testing.T) {
	testutil.RequireRoot(t)
	for _, fstype := range []string{"xfs", "ext4"} {
		t.Run(fstype, func(t *testing.T) {
			mnt := testfs.FileSystem(t, run, fstype, 300<<20, nil, "")
			path := filepath.Join(mnt, "img")
			if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
				t.Fatal(err)
			}
			f, err := OpenUntimed(path)
			if fstype != "xfs" {
				if !errors.Is(err, unix.EOPNOTSUPP) {
					t.Fatalf("on %s: %v, want EOPNOTSUPP", fstype, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var before, after unix.Stat_t
			unix.Stat(path, &before)
			time.Sleep(20 * time.Millisecond) // past a clock tick
			if _, err := f.WriteAt([]byte("untimed"), 4096); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			unix.Stat(path, &after)
			if after.Mtim != before.Mtim || after.Ctim != before.Ctim {
				t.Fatalf("times moved: mtime %v -> %v, ctime %v -> %v", before.Mtim, after.Mtim, before.Ctim, after.Ctim)
			}
			got := make([]byte, 7)
			if _, err := f.ReadAt(got, 4096); err != nil || string(got) != "untimed" {
				t.Fatalf("read back %q (%v)", got, err)
			}
			if fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
				t.Fatalf("descriptor flags %#x (%v), want close-on-exec", fl, err)
			}
		})
	}
}
