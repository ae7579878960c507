package engine

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// sendImage is what a clone of image volume v on another node reads: a
// copy of its image cut frozen into the pool's tmp/ (a reflink where the
// pool shares blocks), streamed as extents; the copy is unlinked once
// open, so nothing is left of it when the stream ends, and start clears
// tmp/ of what a crash leaves.
func (d *Engine) sendImage(ctx context.Context, v VolumeRecord) (io.ReadCloser, error) {
	tmp := filepath.Join(d.PoolOf(v.Pool).Paths.Tmp(), fmt.Sprintf("%s.send-%d", v.ID, time.Now().UnixNano()))
	defer os.Remove(tmp)
	err := d.frozen(ctx, []VolumeRecord{v}, func(ctx context.Context) error {
		return copyImage(ctx, d.VolumeDataPath(v), tmp)
	})
	if err != nil {
		return nil, fmt.Errorf("copying the image of volume %s to send it: %w", v.ID, err)
	}
	return extentsOf(ctx, tmp)
}

// copyImage copies the image file src into the new file dst, after the
// writes its loop devices cache are flushed into it.
func copyImage(ctx context.Context, src, dst string) error {
	if err := flushAll(src); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	size, _, err := fsops.FileSize(in)
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	_, err = fsops.CopyFileData(ctx, int(out.Fd()), int(in.Fd()), size, nil)
	return err
}

// cutImage copies image volume v's image into the pool's tmp/ (a
// reflink where the pool shares blocks) and returns the copy's path: what
// a snapshot that is not a copy in place cuts while v is frozen. Start
// clears tmp/ of what a crash leaves.
func (d *Engine) cutImage(ctx context.Context, v VolumeRecord) (string, error) {
	img := filepath.Join(d.PoolOf(v.Pool).Paths.Tmp(), fmt.Sprintf("%s.cut-%d.img", v.ID, time.Now().UnixNano()))
	if err := copyImage(ctx, d.VolumeDataPath(v), img); err != nil {
		os.Remove(img)
		return "", fmt.Errorf("copying the image of volume %s: %w", v.ID, err)
	}
	return img, nil
}

// imageTree runs fn on the tree of img, a copy of image volume v's image,
// mounted read-only on a read-only loop device of its own beside it in
// the pool's tmp/. Everything is undone when fn returns.
func (d *Engine) imageTree(v VolumeRecord, img string, fn func(tree string) error) (err error) {
	mnt := strings.TrimSuffix(img, ".img") + ".mnt"
	dev, err := loop.Attach(img, loop.Options{ReadOnly: true, BlockSize: deviceBlockSize(img)})
	if err != nil {
		return err
	}
	defer func() {
		if derr := loop.Detach(dev); derr != nil && err == nil {
			err = derr
		}
	}()
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	defer os.Remove(mnt)
	if _, err := mountImage(dev, mnt, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC); err != nil {
		return fmt.Errorf("mounting the copy of volume %s's file system: %w", v.ID, err)
	}
	defer func() {
		if uerr := fsops.Unmount(mnt); uerr != nil && err == nil {
			err = uerr
		}
	}()
	return fn(mnt)
}
