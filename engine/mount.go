package engine

import (
	"context"
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/iolimit"
	"github.com/hostpath-csi/hostpath/loop"
)

// nodeVolume takes the volume's lock and returns its record.
func (d *Engine) nodeVolume(id string) (VolumeRecord, func(), error) {
	return d.nodeVolumeOrProvision(context.Background(), id, nil, "")
}

// nodeVolumeOrProvision is nodeVolume, but brings an inline or local
// volume the volume context describes into being if it is not there yet
// (with no context it answers NotFound).
func (d *Engine) nodeVolumeOrProvision(ctx context.Context, id string, vctx map[string]string, access string) (VolumeRecord, func(), error) {
	unlock, err := d.Locks.lock("volume "+id, VolIDKey(id))
	if err != nil {
		return VolumeRecord{}, nil, err
	}
	if v, ok := d.LookupNodeVolume(id); ok {
		return v, unlock, nil
	}
	v, err := d.provisionOnNode(ctx, id, vctx, access)
	if err != nil {
		unlock()
		return VolumeRecord{}, nil, err
	}
	return v, unlock, nil
}

// inspectMount returns the mount at path (nil if there is none) and
// whether it shows the volume.
func (d *Engine) inspectMount(path string, v VolumeRecord) (*fsops.MountPoint, bool, error) {
	mp, err := d.MountPoint(path)
	if err != nil && !os.IsNotExist(err) {
		return nil, false, StorageErr(ErrUnsure, "cannot tell whether volume %s is mounted at %s: %v; nothing was changed, retry once the path can be inspected", v.ID, path, err)
	}
	if mp == nil {
		return nil, false, nil
	}
	ours, err := d.layoutFor(v).shows(mp, v)
	if err != nil {
		return nil, false, StorageErr(ErrUnsure, "cannot tell whether %s (%s on %s) shows volume %s: %v; nothing was changed, retry once the volume's data can be inspected", path, mp.Source, mp.Root, v.ID, err)
	}
	return mp, ours, nil
}

// bindVolume mounts the volume at path unless it is already there. A
// different mount at path is FailedPrecondition; path is created (a
// directory, or a file for a block volume) if it does not exist. A mount
// volume's tree is mounted nosuid and nodev: a device node or setuid
// program in it (a pod's, or a restore's from another node) is inert. A
// block volume's bind is of a device node, which nodev would break.
func (d *Engine) bindVolume(v VolumeRecord, path string, flags uintptr, dir bool) error {
	if dir {
		flags |= unix.MS_NOSUID | unix.MS_NODEV
	}
	mp, ours, err := d.inspectMount(path, v)
	if err != nil {
		return err
	}
	if mp != nil {
		if !ours {
			return StorageErr(ErrInUse, "%s already has another mount (%s on %s); it cannot also show volume %s", path, mp.Source, mp.Root, v.ID)
		}
		if mp.ReadOnly != (flags&fsops.ReadOnly != 0) {
			return StorageErr(ErrExists, "volume %s is already mounted at %s with read-only=%v; the request asks read-only=%v", v.ID, path, mp.ReadOnly, !mp.ReadOnly)
		}
		return nil
	}
	if err := fsops.MakeMountPoint(path, dir); err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	src, roDev, err := d.layoutFor(v).mountSource(v, flags&fsops.ReadOnly != 0)
	if err != nil {
		return fmt.Errorf("finding the source of volume %s: %w", v.ID, err)
	}
	if err := fsops.BindMount(src, path, flags); err != nil {
		if roDev != nil {
			_ = loop.Detach(*roDev)
		}
		return fmt.Errorf("mounting volume %s at %s: %w", v.ID, path, err)
	}
	return nil
}

// unbindVolume unmounts the volume from path if it is mounted there, and
// removes path if asked. A mount of something else is refused.
func (d *Engine) unbindVolume(v VolumeRecord, path string, remove bool) error {
	mp, ours, err := d.inspectMount(path, v)
	if err != nil {
		return err
	}
	if mp != nil {
		if !ours {
			return StorageErr(ErrInUse, "%s shows another mount (%s on %s), not volume %s; not unmounting it", path, mp.Source, mp.Root, v.ID)
		}
		if err := fsops.Unmount(path); err != nil {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
		if err := d.layoutFor(v).unmounted(mp, v); err != nil {
			return err
		}
	}
	if remove {
		if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("removing %s: %w", path, err)
		}
	}
	return nil
}

// publishVolume shows volume v, whose lock the caller holds, at target:
// refused while another target holds it single-writer; the publication
// recorded before the mount (a crash after it still knows the target).
func (d *Engine) publishVolume(v VolumeRecord, target string, flags uintptr, readOnly, single bool) error {
	for _, p := range v.Published {
		if p.Target == target || !(single || p.SingleWriter) {
			continue
		}
		ours, err := d.ShowsVolume(p.Target, v)
		if err != nil {
			return err
		}
		if ours {
			return StorageErr(ErrInUse, "volume %s is SINGLE_NODE_SINGLE_WRITER and already published at %s", v.ID, p.Target)
		}
	}
	if err := d.settleBlock(&v); err != nil {
		return fmt.Errorf("making the backing file of volume %s durable: %w", v.ID, err)
	}
	if !slices.ContainsFunc(v.Published, func(p publication) bool { return p.Target == target }) {
		v.Published = append(v.Published, publication{Target: target, ReadOnly: readOnly, SingleWriter: single})
		if err := d.Records.Volumes.Put(v); err != nil {
			return fmt.Errorf("recording publication of volume %s: %w", v.ID, err)
		}
	}
	if err := d.bindVolume(v, target, flags, v.AccessType == AccessMount); err != nil {
		if NodeCreated(v) {
			v.Published = slices.DeleteFunc(v.Published, func(p publication) bool { return p.Target == target })
			if rerr := d.releaseNodeCreated(v); rerr != nil {
				klog.ErrorS(rerr, "releasing an inline or local volume whose publish failed; the next start clears it", "volume_id", v.ID)
			}
		}
		return err
	}
	// The volume's I/O limits hold in the pod before it starts: a publish
	// that cannot set them fails (and kubelet retries it).
	if l := ioLimitsOf(v.Mutable); !l.IsZero() {
		d.ioMu.Lock()
		defer d.ioMu.Unlock()
		return d.applyIOLimits(v, []publication{{Target: target}}, l, iolimit.Limits{})
	}
	return nil
}
