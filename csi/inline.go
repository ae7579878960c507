package csi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Volumes that NodePublishVolume brings into being, with ids the CO chose:
//
//   - CSI ephemeral inline volumes (volume context
//     csi.storage.k8s.io/ephemeral=true): a fresh directory volume of the
//     "size" attribute (default 100Mi), made on publish and deleted on
//     unpublish, and cleared at start if a crash left one unpublished;
//   - static local volumes, like Kubernetes local PersistentVolumes: the
//     "localPath" attribute names an existing directory under a root the
//     operator allowed (--local-root); publish bind-mounts it.
//
// Both get an ordinary record (found by the CO's id through its name), so
// locking, identity checks and unpublish work as for any volume.
const (
	ctxEphemeral         = "csi.storage.k8s.io/ephemeral"
	ctxSize              = "size"
	ctxLocalPath         = "localPath"
	defaultEphemeralSize = 100 << 20
	ephemeralPrefix      = "ephemeral/"
	localPrefix          = "local/"
)

// nodeCreated reports whether a record was made by NodePublishVolume.
func nodeCreated(v volumeRecord) bool {
	return strings.HasPrefix(v.Name, ephemeralPrefix) || strings.HasPrefix(v.Name, localPrefix)
}

// lookupNodeVolume finds a volume by this driver's id, or by the CO's id
// of an inline or local volume.
func (d *engine) lookupNodeVolume(id string) (volumeRecord, bool) {
	if validVolumeID(id) {
		v, ok := d.st.Volumes.Get(id)
		return v, ok && v.Phase == phaseReady
	}
	for _, name := range []string{ephemeralPrefix + id, localPrefix + id} {
		if v, ok := d.st.Volumes.ByName(name); ok && v.Phase == phaseReady {
			return v, true
		}
	}
	return volumeRecord{}, false
}

// provisionOnNode makes the record (and, for an inline volume, the data)
// of a volume the volume context describes. It returns NotFound when the
// context describes none.
func (d *engine) provisionOnNode(ctx context.Context, id string, vctx map[string]string, access string) (volumeRecord, error) {
	switch {
	case vctx[ctxEphemeral] == "true":
		if access != accessMount {
			return volumeRecord{}, storageErr(ErrInvalid, "inline ephemeral volumes are directories; a block capability cannot be served")
		}
		size := int64(defaultEphemeralSize)
		if s, ok := vctx[ctxSize]; ok {
			n, err := ParseQuantity(s)
			if err != nil || n <= 0 {
				return volumeRecord{}, storageErr(ErrInvalid, "volume attribute %s=%q: %v", ctxSize, s, err)
			}
			size = n
		}
		for k := range vctx {
			if k != ctxEphemeral && k != ctxSize && !strings.HasPrefix(k, coParamPrefix) {
				return volumeRecord{}, storageErr(ErrInvalid, "unknown volume attribute %q for an inline volume; this driver takes %q", k, ctxSize)
			}
		}
		if d.cfg.MaxVolumeSize > 0 && size > d.cfg.MaxVolumeSize {
			return volumeRecord{}, storageErr(ErrOutOfRange, "inline volume of %d bytes exceeds --max-volume-size %d", size, d.cfg.MaxVolumeSize)
		}
		return d.provisionVolume(ctx, volumeRecord{Name: ephemeralPrefix + id, CapacityBytes: size, AccessType: accessMount}, "")
	case vctx[ctxLocalPath] != "":
		path, err := d.checkLocalPath(vctx[ctxLocalPath])
		if err != nil {
			return volumeRecord{}, err
		}
		if access != accessMount {
			return volumeRecord{}, storageErr(ErrInvalid, "local volumes are directories; a block capability cannot be served")
		}
		// The data is the operator's directory: nothing to make, the record
		// is ready as it is written.
		rec := volumeRecord{ID: d.newVolumeID(), Name: localPrefix + id, AccessType: accessMount, Phase: phaseReady, CreatedAt: time.Now().UTC(), LocalPath: path}
		return d.volumes().create(rec, nil, nil)
	}
	return volumeRecord{}, storageErr(ErrNotFound, "volume %q does not exist on this node", id)
}

// checkLocalPath allows an existing directory below one of --local-root,
// symlinks resolved, and never the driver's own state dir.
func (d *engine) checkLocalPath(p string) (string, error) {
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", storageErr(ErrInvalid, "local path %q is not an absolute path", p)
	}
	if len(d.cfg.LocalRoots) == 0 {
		return "", storageErr(ErrInvalid, "local path %q: local volumes are off; allow a root with --local-root", p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", storageErr(ErrNotFound, "local path %q does not exist on node %s", p, d.cfg.NodeID)
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.IsDir() {
		return "", storageErr(ErrNotFound, "local path %q is not a directory on node %s", p, d.cfg.NodeID)
	}
	if dir := d.ownDirHolding(real); dir != "" {
		return "", storageErr(ErrInvalid, "local path %q is inside the driver's own directory %s", p, dir)
	}
	for _, root := range d.cfg.LocalRoots {
		r, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if within(r, real) {
			return real, nil
		}
	}
	return "", storageErr(ErrForbidden, "local path %q (%s) is outside the allowed roots %v (--local-root)", p, real, d.cfg.LocalRoots)
}

// releaseNodeCreated deletes an inline volume, or forgets a local one,
// once nothing publishes it any more.
func (d *engine) releaseNodeCreated(v volumeRecord) error {
	if !nodeCreated(v) || len(v.Published) > 0 || len(v.Staged) > 0 {
		return nil
	}
	if d.locks.pinned(volIDKey(v.ID)) {
		return storageErr(ErrBusy, "inline volume %s is unmounted but is the source of a snapshot or clone in progress; it is removed on a retry once that is done", v.Name)
	}
	v.Phase = phaseDeleting
	if err := d.st.Volumes.Put(v); err != nil {
		return err
	}
	if err := d.removeVolumeData(v); err != nil {
		return fmt.Errorf("removing inline volume %s: %w", v.Name, err)
	}
	return d.st.Volumes.Drop(v.ID)
}
