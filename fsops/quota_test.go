package fsops

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// quotaFS makes a loop-mounted file system with project quotas on.
func quotaFS(t *testing.T, fstype string) string {
	var args []string
	if fstype == "ext4" {
		args = []string{"-O", "project,quota"}
	}
	return testfs.FileSystem(t, run, fstype, 300<<20, args, "prjquota")
}

// TestProjectQuota enforces a project quota where the kernel can (XFS with
// CONFIG_XFS_QUOTA, ext4 with CONFIG_QFMT_V2). Where it cannot, it checks
// the other half of the contract: the file system is reported as without
// project quotas, so the driver falls back to accounting.
func TestProjectQuota(t *testing.T) {
	for _, tc := range []struct{ fstype, option string }{{"xfs", "CONFIG_XFS_QUOTA"}, {"ext4", "CONFIG_QFMT_V2"}} {
		fstype := tc.fstype
		t.Run(fstype, func(t *testing.T) {
			testutil.RequireRoot(t)
			if !testutil.KernelHas(t, tc.option) {
				mnt := testfs.FileSystem(t, run, fstype, 300<<20, nil, "")
				if err := ProjectQuotaSupported(mnt); err == nil {
					t.Fatalf("kernel without %s, yet %s reports project quotas", tc.option, fstype)
				}
				t.Logf("kernel lacks %s: checked that %s reports no project quotas; enforcement not exercised here", tc.option, fstype)
				return
			}
			mnt := quotaFS(t, fstype)
			if err := ProjectQuotaSupported(mnt); err != nil {
				t.Fatal(err)
			}
			vol := filepath.Join(mnt, "vol")
			os.Mkdir(vol, 0o777)
			if err := SetProject(vol, 4242); err != nil {
				t.Fatal(err)
			}
			if err := SetProjectLimit(mnt, 4242, 4<<20); err != nil {
				t.Fatal(err)
			}
			os.Mkdir(filepath.Join(vol, "sub"), 0o777) // inherits the project
			f, err := os.Create(filepath.Join(vol, "sub", "big"))
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1<<20)
			werr := testutil.AsPod(t, func() (err error) {
				for i := 0; i < 8 && err == nil; i++ {
					if _, err = f.Write(buf); err == nil {
						err = f.Sync()
					}
				}
				return err
			})
			f.Close()
			// ext4 says EDQUOT; XFS says ENOSPC for project quotas, as if
			// the volume were a file system of its own.
			if !errors.Is(werr, unix.EDQUOT) && !errors.Is(werr, unix.ENOSPC) {
				u, uerr := GetProjectUsage(mnt, 4242)
				t.Fatalf("writing 8 MiB under a 4 MiB quota: %v, want EDQUOT or ENOSPC (project: %+v, %v)", werr, u, uerr)
			}
			u, err := GetProjectUsage(mnt, 4242)
			if err != nil {
				t.Fatal(err)
			}
			if u.LimitBytes != 4<<20 || u.UsedBytes < 3<<20 || u.UsedBytes > 4<<20 || u.Inodes != 3 {
				t.Fatalf("usage %+v", u)
			}
			if err := SetProjectLimit(mnt, 4242, 16<<20); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(vol, "more"), buf, 0o644); err != nil {
				t.Fatalf("after raising the limit: %v", err)
			}
		})
	}
}
