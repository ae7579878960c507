package fsops

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testfs"
)

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

// btrfsFS makes a loop-mounted btrfs, with quota groups on if asked.
func btrfsFS(t testing.TB, quota bool) string {
	if quota {
		return testfs.FileSystem(t, run, "btrfs", 300<<20, nil, "", []string{"btrfs", "quota", "enable"})
	}
	return testfs.FileSystem(t, run, "btrfs", 300<<20, nil, "")
}

func TestBtrfsSubvolumeLimit(t *testing.T) {
	mnt := btrfsFS(t, true)
	if !IsBtrfs(mnt) {
		t.Fatal("not btrfs")
	}
	if err := BtrfsQuotaEnabled(mnt); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(mnt, "vol")
	if err := CreateSubvolume(vol); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Stat(vol, &st)
	if st.Ino != 256 {
		t.Fatalf("%s is not a subvolume root (inode %d)", vol, st.Ino)
	}
	if err := SetSubvolumeLimit(vol, 4<<20); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(filepath.Join(vol, "big"))
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 31)
	}
	var werr error
	for i := 0; i < 8 && werr == nil; i++ {
		if _, werr = f.Write(buf); werr == nil {
			werr = f.Sync()
		}
	}
	f.Close()
	if !errors.Is(werr, unix.EDQUOT) {
		t.Fatalf("writing 8 MiB into a 4 MiB subvolume: %v, want EDQUOT", werr)
	}
	if err := SetSubvolumeLimit(vol, 64<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "more"), buf, 0o644); err != nil {
		t.Fatalf("after raising the limit: %v", err)
	}
	if err := RemoveAll(vol); err != nil {
		t.Fatalf("removing a subvolume: %v", err)
	}
	if _, err := os.Stat(vol); !os.IsNotExist(err) {
		t.Fatal("subvolume still there")
	}
}

func TestBtrfsQuotaDisabled(t *testing.T) {
	mnt := btrfsFS(t, false)
	if err := BtrfsQuotaEnabled(mnt); !errors.Is(err, unix.ENOTSUP) {
		t.Fatalf("quota off: %v, want ENOTSUP", err)
	}
}
