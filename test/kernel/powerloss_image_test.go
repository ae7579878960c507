package kernel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/loop"

	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

// checkImage checks an image volume's file system (fs: ext4 when empty,
// or xfs) on a copy of its image, as a boot would find it: its journal
// replayed (e2fsck -E journal_only; XFS's log by a mount), then clean
// (e2fsck -fn, xfs_repair -n); and, if written is not 0, that the image
// writer's file holds at least that many bytes of its records.
func checkImage(img string, written int64, fs string) (problems []string) {
	tmp, err := os.MkdirTemp("", "powerloss-image-")
	if err != nil {
		return []string{err.Error()}
	}
	defer os.RemoveAll(tmp)
	cp := filepath.Join(tmp, "copy.img")
	if out, err := exec.Command("cp", "--sparse=always", img, cp).CombinedOutput(); err != nil {
		return []string{fmt.Sprintf("copying its image: %v: %s", err, out)}
	}
	if fs == "xfs" {
		return checkXFSImage(tmp, cp)
	}
	if out, err := exec.Command("e2fsck", "-E", "journal_only", "-y", cp).CombinedOutput(); err != nil {
		problems = append(problems, fmt.Sprintf("replaying its journal: %v: %s", err, lastLines(string(out), 3)))
	}
	if out, err := exec.Command("e2fsck", "-fn", cp).CombinedOutput(); err != nil {
		problems = append(problems, fmt.Sprintf("not clean after its journal's replay: %v: %s", err, lastLines(string(out), 3)))
	}
	if written == 0 {
		return problems
	}
	out := filepath.Join(tmp, "writer")
	if b, err := exec.Command("debugfs", "-R", "dump /"+plan.ImageWriterFile+" "+out, cp).CombinedOutput(); err != nil {
		return append(problems, fmt.Sprintf("reading the image writer's file: %v: %s", err, b))
	}
	b, err := os.ReadFile(out)
	if err != nil || int64(len(b)) < written {
		return append(problems, fmt.Sprintf("the image writer fsynced %d bytes, %d are there (%v)", written, len(b), err))
	}
	for n := 0; int64(n+1)*plan.RecordSize <= written; n++ {
		if string(b[n*plan.RecordSize:(n+1)*plan.RecordSize]) != string(plan.Record(n)) {
			return append(problems, fmt.Sprintf("the image writer's record %d (fsynced) differs", n))
		}
	}
	return problems
}

// checkXFSImage replays the log of the XFS in the image copy cp by a
// mount (nouuid: the original may be mounted) and has xfs_repair -n check
// what that left.
func checkXFSImage(tmp, cp string) (problems []string) {
	mnt := filepath.Join(tmp, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return []string{err.Error()}
	}
	dev, err := loop.Attach(cp, loop.Options{})
	if err != nil {
		return []string{fmt.Sprintf("attaching its copy: %v", err)}
	}
	if err := syscall.Mount(dev.Path(), mnt, "xfs", 0, "nouuid"); err != nil {
		problems = append(problems, fmt.Sprintf("mounting it (its log replays): %v", err))
	} else if err := syscall.Unmount(mnt, 0); err != nil {
		problems = append(problems, fmt.Sprintf("unmounting it: %v", err))
	}
	if err := loop.Detach(dev); err != nil {
		problems = append(problems, fmt.Sprintf("detaching its copy: %v", err))
	}
	if out, err := exec.Command("xfs_repair", "-n", "-f", cp).CombinedOutput(); err != nil {
		problems = append(problems, fmt.Sprintf("not clean after its log's replay: %v: %s", err, lastLines(string(out), 3)))
	}
	return problems
}

// stageGrown stages image volume id, which the workload grew while it was
// not staged (growOffline), through the driver started on the point: the
// stage finishes a growth the power loss cut before it mounts. Staged, the
// volume must hold every file acknowledged on it, and, if its expand to
// plan.GrownSize was acknowledged, a file system past the old one's single
// group; then it is unstaged, for checkImage to find it clean.
func stageGrown(ctx context.Context, node csipb.NodeClient, id string, files []plan.Op, size int64) (problems []string) {
	staging, err := os.MkdirTemp("", "powerloss-grown-")
	if err != nil {
		return []string{err.Error()}
	}
	defer os.Remove(staging)
	mount := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: mount}); err != nil {
		return []string{fmt.Sprintf("staging it: %v", err)}
	}
	defer func() {
		if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			problems = append(problems, fmt.Sprintf("unstaging it: %v", err))
		}
	}()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(staging, f.File))
		if h := sha256.Sum256(b); err != nil || hex.EncodeToString(h[:]) != f.Sum {
			problems = append(problems, fmt.Sprintf("file %s, fsynced, is not there as written (%d bytes, %v)", f.File, len(b), err))
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(staging, &st); err != nil {
		return append(problems, fmt.Sprintf("statfs: %v", err))
	}
	// One group is 128 MiB; the metadata statfs leaves out is a few.
	if total := int64(st.Blocks) * st.Bsize; size >= plan.GrownSize && total < 128<<20 {
		problems = append(problems, fmt.Sprintf("its file system has %d bytes after the acknowledged growth to %d", total, size))
	}
	return problems
}
