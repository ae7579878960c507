package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hostpath-csi/hostpath/iolimit"
	"k8s.io/klog/v2"
)

// I/O limits, mutable parameters (VolumeAttributesClass) of image and
// block volumes: each a positive integer, per second, for the volume's
// loop device in the cgroups of the pods that publish it.
const (
	MutableReadIOPS  = "readIOPS"
	MutableWriteIOPS = "writeIOPS"
	MutableReadBPS   = "readBytesPerSecond"
	MutableWriteBPS  = "writeBytesPerSecond"
)

// ioLimitKeys are the I/O limits' parameters, in iolimit.Limits' order.
var ioLimitKeys = [4]string{MutableReadIOPS, MutableWriteIOPS, MutableReadBPS, MutableWriteBPS}

// IsIOLimit says a parameter is one of the I/O limits.
func IsIOLimit(key string) bool { return slices.Contains(ioLimitKeys[:], key) }

// CheckIOLimit validates one limit's value: a positive integer.
func CheckIOLimit(key, value string) error {
	n, err := strconv.ParseUint(value, 10, 64)
	if err != nil || n == 0 {
		return StorageErr(ErrInvalid, "mutable parameter %s=%q: want a positive integer (%s)", key, value, ioLimitUnit(key))
	}
	return nil
}

func ioLimitUnit(key string) string {
	if strings.HasSuffix(key, "IOPS") {
		return "operations per second"
	}
	return "bytes per second"
}

// ioLimitsOf is the limits a volume's mutable parameters set.
func ioLimitsOf(mutable map[string]string) iolimit.Limits {
	var v [4]uint64
	for i, k := range ioLimitKeys {
		v[i], _ = strconv.ParseUint(mutable[k], 10, 64)
	}
	return iolimit.Limits{ReadIOPS: v[0], WriteIOPS: v[1], ReadBytesPerSecond: v[2], WriteBytesPerSecond: v[3]}
}

// checkIOLimitsFor refuses I/O limits for a volume with no device of its
// own: a directory volume is a bind mount of its pool, whose device a
// throttle would hold for every volume in it.
func checkIOLimitsFor(v VolumeRecord, params map[string]string) error {
	for k := range params {
		if IsIOLimit(k) && v.AccessType == AccessMount && !isImage(v) {
			return StorageErr(ErrInvalid, "mutable parameter %s: I/O limits hold a volume's own device, and volume %s is a directory volume (a bind mount of its pool's disk, which it shares with every volume there); use layout=image or a block volume", k, v.ID)
		}
	}
	return nil
}

// cgroups is the host's cgroup hierarchy for I/O limits, found at the
// first need and kept.
type cgroups struct {
	once sync.Once
	h    iolimit.Hierarchy
	err  error
}

func (d *Engine) cgroupHierarchy() (iolimit.Hierarchy, error) {
	d.cg.once.Do(func() {
		mount := d.Config.CgroupMount
		if mount == "" {
			mount = "/sys/fs/cgroup"
		}
		d.cg.h, d.cg.err = iolimit.Detect(mount)
		if d.cg.err != nil {
			d.cg.err = fmt.Errorf("no cgroup I/O controller under %s (--cgroup-mount: where the host's /sys/fs/cgroup is mounted in the driver's container): %w", mount, d.cg.err)
		}
	})
	return d.cg.h, d.cg.err
}

// podUIDOf is the pod a publication's target belongs to, from kubelet's
// paths: .../pods/<uid>/volumes/... (a mount) or
// .../volumeDevices/publish/<pv>/<uid> (a block volume).
func podUIDOf(target string) string {
	parts := strings.Split(filepath.Clean(target), "/")
	for i, p := range parts {
		if p == "pods" && i+2 < len(parts) && parts[i+2] == "volumes" {
			return parts[i+1]
		}
		if p == "publish" && i > 0 && parts[i-1] == "volumeDevices" && i+2 < len(parts) {
			return parts[i+2]
		}
	}
	return ""
}

// applyIOLimits sets l for the device volume v shows at each of its
// publications, in their pods' cgroups. On an error the publications
// already set are given old back, and the error names the publication.
func (d *Engine) applyIOLimits(v VolumeRecord, pubs []publication, l, old iolimit.Limits) error {
	h, err := d.cgroupHierarchy()
	if err != nil {
		return err
	}
	if d.lifted[v.ID] {
		// A freeze has lifted the writes' limits; its end sets what the
		// record says then.
		l, old = withoutWrites(l), withoutWrites(old)
	}
	var done []func()
	undo := func() {
		for _, f := range done {
			f()
		}
	}
	for _, p := range pubs {
		dir, dev, err := d.publicationCgroup(h, v, p)
		if err != nil {
			undo()
			return err
		}
		if err := h.Set(dir, dev, l); err != nil {
			undo()
			return fmt.Errorf("setting the I/O limits of volume %s for the pod of %s (cgroup %s, device %s): %w", v.ID, p.Target, dir, dev, err)
		}
		d.watchPod(h, dir)
		done = append(done, func() {
			if err := h.Set(dir, dev, old); err != nil {
				klog.ErrorS(err, "putting back a volume's I/O limits", "volume_id", v.ID, "cgroup", dir)
			}
		})
	}
	return nil
}

// publicationCgroup is the cgroup of a publication's pod and the device
// it shows there; a pod without a cgroup is gone (ErrInUse, naming it).
func (d *Engine) publicationCgroup(h iolimit.Hierarchy, v VolumeRecord, p publication) (string, iolimit.Device, error) {
	uid := podUIDOf(p.Target)
	if uid == "" {
		return "", iolimit.Device{}, StorageErr(ErrInvalid, "volume %s is published at %s, which names no pod: its I/O limits have no cgroup to go to", v.ID, p.Target)
	}
	ours, err := d.ShowsVolume(p.Target, v)
	if err != nil {
		return "", iolimit.Device{}, err
	}
	if !ours {
		return "", iolimit.Device{}, StorageErr(ErrInUse, "volume %s is recorded as published at %s, which does not show it now; its I/O limits were not changed (retried once kubelet has unpublished it)", v.ID, p.Target)
	}
	dev, err := iolimit.DeviceOf(p.Target)
	if err != nil {
		return "", iolimit.Device{}, err
	}
	dir, err := h.PodCgroup(uid)
	if errors.Is(err, fs.ErrNotExist) {
		return "", iolimit.Device{}, StorageErr(ErrInUse, "pod %s, which volume %s is published for at %s, has no cgroup on this node (the pod is gone); the old I/O limits stay until kubelet unpublishes the volume, and the new ones apply to its next pod", uid, v.ID, p.Target)
	}
	if err != nil {
		return "", iolimit.Device{}, err
	}
	return dir, dev, nil
}

// enforceIOLimits sets each limited volume's limits again in its pods'
// cgroups every interval until stop is closed, and at once in a pod's
// when a cgroup is made below it (inotify): on cgroup v1 a container's
// cgroup, made after the publication, takes the limits only so (v1's
// throttling is not hierarchical); on v2 it finds nothing to write.
func (d *Engine) enforceIOLimits(every time.Duration, stop <-chan struct{}) {
	var events <-chan string
	if w, err := iolimit.NewWatcher(); err != nil {
		klog.ErrorS(err, "watching pods' cgroups for new containers: their I/O limits are set only every interval", "interval", every)
	} else {
		defer w.Close()
		d.cgWatch.Store(w)
		events = w.Events()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			d.setIOLimits("")
		case made := <-events:
			if uid := iolimit.PodUIDOf(filepath.Base(filepath.Dir(made))); uid != "" {
				d.setIOLimits(uid)
			}
		}
	}
}

// setIOLimits sets every limited volume's limits in the cgroups of the
// pods that publish it (only the pod with uid only, if not empty), and
// watches those cgroups for containers made later.
func (d *Engine) setIOLimits(only string) {
	h, err := d.cgroupHierarchy()
	if err != nil {
		return
	}
	for _, v := range d.Records.Volumes.All() {
		if ioLimitsOf(v.Mutable).IsZero() || len(v.Published) == 0 {
			continue
		}
		d.ioMu.Lock()
		// Read again under the lock: a modify may have just changed the
		// limits.
		if v, ok := d.Records.Volumes.Get(v.ID); ok {
			d.setVolumeIOLimitsLocked(h, v, only)
		}
		d.ioMu.Unlock()
	}
}

// setVolumeIOLimitsLocked sets volume v's limits (less the writes' while
// a freeze has lifted them) in the cgroups of the pods that publish it
// (only the pod with uid only, if not empty). The caller holds ioMu.
func (d *Engine) setVolumeIOLimitsLocked(h iolimit.Hierarchy, v VolumeRecord, only string) {
	l := ioLimitsOf(v.Mutable)
	if l.IsZero() {
		return
	}
	if d.lifted[v.ID] {
		l = withoutWrites(l)
	}
	for _, p := range v.Published {
		if only != "" && podUIDOf(p.Target) != only {
			continue
		}
		dir, dev, err := d.publicationCgroup(h, v, p)
		if err == nil {
			err = h.Set(dir, dev, l)
		}
		if err == nil {
			d.watchPod(h, dir)
		}
		if err != nil && !errors.Is(err, ErrInUse) {
			klog.ErrorS(err, "setting a volume's I/O limits for a container of its pod", "volume_id", v.ID, "target", p.Target)
		}
	}
}

// withoutWrites is l with no limit on writes.
func withoutWrites(l iolimit.Limits) iolimit.Limits {
	l.WriteIOPS, l.WriteBytesPerSecond = 0, 0
	return l
}

// liftWriteLimits lifts the write limits of image volume v in its pods'
// cgroups for a freeze, and returns what sets them again (from the
// record as it is then). On cgroup v2, io.max throttles writeback too:
// the sync before FIFREEZE, and the one inside it, would write the pod's
// dirty pages at the pod's write limit (1 MiB/s and 150 MB dirty: minutes
// with its writes stalled, and --max-freeze cannot cut a sync), so a
// freeze of a volume with write limits would never end in time. Lifted
// from before the sync to the thaw, the pod's writes are held by the
// freeze itself meanwhile. On v1, whose throttling leaves writeback
// alone, nothing is lifted.
func (d *Engine) liftWriteLimits(v VolumeRecord) func() {
	l := ioLimitsOf(v.Mutable)
	if withoutWrites(l) == l || len(v.Published) == 0 {
		return func() {}
	}
	h, err := d.cgroupHierarchy()
	if err != nil || !h.V2 {
		return func() {}
	}
	set := func(lift bool) {
		d.ioMu.Lock()
		defer d.ioMu.Unlock()
		if d.lifted == nil {
			d.lifted = map[string]bool{}
		}
		if lift {
			d.lifted[v.ID] = true
		} else {
			delete(d.lifted, v.ID)
		}
		if cur, ok := d.Records.Volumes.Get(v.ID); ok {
			d.setVolumeIOLimitsLocked(h, cur, "")
		}
	}
	set(true)
	klog.V(2).InfoS("write limits lifted for a freeze (cgroup v2 throttles writeback, and so the freeze's syncs)", "volume_id", v.ID)
	return func() { set(false) }
}

// watchPod watches a pod's cgroup for containers made below it (cgroup
// v1 only: on v2 they inherit the pod's limits).
func (d *Engine) watchPod(h iolimit.Hierarchy, dir string) {
	w := d.cgWatch.Load()
	if w == nil || h.V2 || w.Watching(dir) {
		return
	}
	if err := w.Add(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		klog.ErrorS(err, "watching a pod's cgroup for new containers", "cgroup", dir)
	}
}
