package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// frozenKey is the context key of the volumes a caller has frozen.
type frozenKey struct{}

// frozen runs fn with the file systems of the image volumes among vs that
// are mounted frozen (FIFREEZE), and thaws them when fn returns, also on
// an error or a cancelled context: what is on their images while fn runs
// is one instant of each, and of all of them together. Volumes the
// context already holds frozen (a group's) are left as they are; one a
// freeze of its own already holds answers ErrBusy. Pods' writes wait
// while frozen, never longer than Config.MaxFreeze: at that bound the file
// systems are thawed and, fn done, the cut is refused (what fn copied
// after the thaw would mix moments). The pause is logged.
func (d *Engine) frozen(ctx context.Context, vs []VolumeRecord, fn func(ctx context.Context) error) error {
	held, _ := ctx.Value(frozenKey{}).(map[string]bool)
	now := map[string]bool{}
	for id := range held {
		now[id] = true
	}
	type thawed struct {
		id, path string
		thaw     func() error
	}
	var (
		mu      sync.Mutex
		froze   []thawed
		overran bool
		unlocks []func()
	)
	thawAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, f := range froze {
			if err := f.thaw(); err != nil {
				klog.ErrorS(err, "thawing an image volume's file system failed; the next start thaws it", "volume_id", f.id, "path", f.path)
			}
		}
		froze = nil
	}
	defer func() {
		thawAll()
		for _, u := range unlocks {
			u()
		}
	}()
	start := time.Now()
	for _, v := range vs {
		if !isImage(v) || now[v.ID] {
			continue
		}
		path, err := d.mountedAt(v)
		if err != nil {
			return err
		}
		if path == "" {
			continue // not mounted: nothing writes to it
		}
		unlock, err := d.Locks.lock("freeze of volume "+v.ID, freezeKey(v.ID))
		if err != nil {
			return err
		}
		unlocks = append(unlocks, unlock)
		// Held through a descriptor: an unstage meanwhile is EBUSY (the
		// CO retries it) instead of hanging on the frozen file system.
		thaw, err := fsops.FreezeHeld(path)
		if err != nil {
			return fmt.Errorf("freezing the file system of volume %s at %s: %w", v.ID, path, err)
		}
		mu.Lock()
		froze = append(froze, thawed{v.ID, path, thaw})
		mu.Unlock()
		now[v.ID] = true
	}
	n := len(froze)
	bound := time.AfterFunc(d.Config.MaxFreeze, func() {
		mu.Lock()
		overran = len(froze) > 0
		mu.Unlock()
		thawAll()
	})
	err := fn(context.WithValue(ctx, frozenKey{}, now))
	bound.Stop()
	if n > 0 {
		klog.InfoS("image volumes frozen", "volumes", n, "pause", min(time.Since(start), d.Config.MaxFreeze))
	}
	mu.Lock()
	defer mu.Unlock()
	if err == nil && overran {
		return StorageErr(ErrForbidden, "the copy of %d image volumes took longer than --max-freeze=%v, so their file systems were thawed before it ended and the cut is refused (a copy after the thaw would mix moments); on a pool that shares blocks (XFS with reflink, btrfs) the copy takes milliseconds, or raise --max-freeze", n, d.Config.MaxFreeze)
	}
	return err
}

// freezeKey is the lock of a volume's freeze.
func freezeKey(id string) string { return "freeze/" + id }

// writeImageSnapshot copies an image volume's file, frozen if it is
// mounted: a reflink where the pool shares blocks (the pause is
// milliseconds), else its allocated extents (the pause is the copy).
func (d *Engine) writeImageSnapshot(ctx context.Context, v VolumeRecord, s SnapshotRecord) (size int64, sum string, err error) {
	err = d.frozen(ctx, []VolumeRecord{v}, func(ctx context.Context) error {
		size, sum, err = d.writeBlockSnapshot(ctx, v, s)
		return err
	})
	return size, sum, err
}

// thawImages thaws, at start, every image volume's file system that is
// frozen: a freeze is the kernel's, so a driver killed between a freeze
// and its thaw leaves the volume frozen and its pods' writes hung until
// someone thaws it.
func (d *Engine) thawImages() {
	for _, v := range d.Records.Volumes.All() {
		if !isImage(v) || v.Phase != PhaseReady {
			continue
		}
		path, err := d.mountedAt(v)
		if err != nil || path == "" {
			continue
		}
		was, err := fsops.ThawIfFrozen(path)
		switch {
		case err != nil && !errors.Is(err, unix.EOPNOTSUPP):
			klog.ErrorS(err, "thawing an image volume's file system at start", "volume_id", v.ID, "path", path)
		case was:
			klog.InfoS("repair: thawed an image volume's file system that a stopped driver left frozen", "volume_id", v.ID, "path", path)
		}
	}
}

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
	_, err = fsops.CopyFileData(int(out.Fd()), int(in.Fd()), size, nil, fsops.ProgressFrom(ctx))
	return err
}

// imageTree runs fn on the tree of image volume v as of one instant: a
// copy of its image cut frozen (a reflink where the pool shares blocks)
// into the pool's tmp/, mounted read-only on a read-only loop device of
// its own. Everything is undone when fn returns; start clears tmp/ of
// what a crash leaves.
func (d *Engine) imageTree(ctx context.Context, v VolumeRecord, fn func(tree string) error) (err error) {
	base := filepath.Join(d.PoolOf(v.Pool).Paths.Tmp(), fmt.Sprintf("%s.tree-%d", v.ID, time.Now().UnixNano()))
	img, mnt := base+".img", base+".mnt"
	defer os.Remove(img)
	if err := d.frozen(ctx, []VolumeRecord{v}, func(ctx context.Context) error { return copyImage(ctx, d.VolumeDataPath(v), img) }); err != nil {
		return fmt.Errorf("copying the image of volume %s: %w", v.ID, err)
	}
	dev, err := loop.Attach(img, loop.Options{ReadOnly: true, BlockSize: imageBlockSize})
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
