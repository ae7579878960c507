package engine

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
	CtxEphemeral         = "csi.storage.k8s.io/ephemeral"
	CtxSize              = "size"
	CtxLocalPath         = "localPath"
	defaultEphemeralSize = 100 << 20
	EphemeralPrefix      = "ephemeral/"
	localPrefix          = "local/"
)

// NodeCreated reports whether a record was made by NodePublishVolume.
func NodeCreated(v VolumeRecord) bool {
	return strings.HasPrefix(v.Name, EphemeralPrefix) || strings.HasPrefix(v.Name, localPrefix)
}

// LookupNodeVolume finds a volume by this driver's id, or by the CO's id
// of an inline or local volume.
func (d *Engine) LookupNodeVolume(id string) (VolumeRecord, bool) {
	if ValidVolumeID(id) {
		v, ok := d.Records.Volumes.Get(id)
		return v, ok && v.Phase == PhaseReady
	}
	for _, name := range []string{EphemeralPrefix + id, localPrefix + id} {
		if v, ok := d.Records.Volumes.ByName(name); ok && v.Phase == PhaseReady {
			return v, true
		}
	}
	return VolumeRecord{}, false
}

// provisionOnNode makes the record (and, for an inline volume, the data)
// of a volume the volume context describes. It returns NotFound when the
// context describes none.
func (d *Engine) provisionOnNode(ctx context.Context, id string, vctx map[string]string, access string) (VolumeRecord, error) {
	switch {
	case vctx[CtxEphemeral] == "true":
		if access != AccessMount {
			return VolumeRecord{}, StorageErr(ErrInvalid, "inline ephemeral volumes are directories; a block capability cannot be served")
		}
		size := int64(defaultEphemeralSize)
		if s, ok := vctx[CtxSize]; ok {
			n, err := ParseQuantity(s)
			if err != nil || n <= 0 {
				return VolumeRecord{}, StorageErr(ErrInvalid, "volume attribute %s=%q: %v", CtxSize, s, err)
			}
			size = n
		}
		for k := range vctx {
			if k != CtxEphemeral && k != CtxSize && !strings.HasPrefix(k, CoParamPrefix) {
				return VolumeRecord{}, StorageErr(ErrInvalid, "unknown volume attribute %q for an inline volume; this driver takes %q", k, CtxSize)
			}
		}
		if d.Config.MaxInlineSize > 0 && size > d.Config.MaxInlineSize {
			return VolumeRecord{}, StorageErr(ErrOutOfRange, "inline ephemeral volume attribute %s=%q is %d bytes, more than this node allows one (--max-inline-size %d); ask for less, or use a PersistentVolumeClaim (a generic ephemeral volume), which ResourceQuota counts", CtxSize, vctx[CtxSize], size, d.Config.MaxInlineSize)
		}
		if d.Config.MaxVolumeSize > 0 && size > d.Config.MaxVolumeSize {
			return VolumeRecord{}, StorageErr(ErrOutOfRange, "inline volume of %d bytes exceeds --max-volume-size %d", size, d.Config.MaxVolumeSize)
		}
		return d.provisionVolume(ctx, VolumeRecord{Name: EphemeralPrefix + id, CapacityBytes: size, AccessType: AccessMount}, "")
	case vctx[CtxLocalPath] != "":
		path, err := d.checkLocalPath(vctx[CtxLocalPath])
		if err != nil {
			return VolumeRecord{}, err
		}
		if access != AccessMount {
			return VolumeRecord{}, StorageErr(ErrInvalid, "local volumes are directories; a block capability cannot be served")
		}
		// The data is the operator's directory: nothing to make, the record
		// is ready as it is written.
		rec := VolumeRecord{ID: d.NewVolumeID(), Name: localPrefix + id, AccessType: AccessMount, Phase: PhaseReady, CreatedAt: time.Now().UTC(), LocalPath: path}
		return d.volumes().create(rec, nil, nil)
	}
	return VolumeRecord{}, StorageErr(ErrNotFound, "volume %q does not exist on this node", id)
}

// checkLocalPath allows an existing directory below one of --local-root,
// symlinks resolved, and never the driver's own state dir.
func (d *Engine) checkLocalPath(p string) (string, error) {
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", StorageErr(ErrInvalid, "local path %q is not an absolute path", p)
	}
	if len(d.Config.LocalRoots) == 0 {
		return "", StorageErr(ErrInvalid, "local path %q: local volumes are off; allow a root with --local-root", p)
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", StorageErr(ErrNotFound, "local path %q does not exist on node %s", p, d.Config.NodeID)
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.IsDir() {
		return "", StorageErr(ErrNotFound, "local path %q is not a directory on node %s", p, d.Config.NodeID)
	}
	if dir := d.OwnDirHolding(real); dir != "" {
		return "", StorageErr(ErrInvalid, "local path %q is inside the driver's own directory %s", p, dir)
	}
	for _, root := range d.Config.LocalRoots {
		r, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		if within(r, real) {
			return real, nil
		}
	}
	return "", StorageErr(ErrForbidden, "local path %q (%s) is outside the allowed roots %v (--local-root)", p, real, d.Config.LocalRoots)
}

// releaseNodeCreated deletes an inline volume, or forgets a local one,
// once nothing publishes it any more.
func (d *Engine) releaseNodeCreated(v VolumeRecord) error {
	if !NodeCreated(v) || len(v.Published) > 0 || len(v.Staged) > 0 {
		return nil
	}
	if d.Locks.Pinned(VolIDKey(v.ID)) {
		return StorageErr(ErrBusy, "inline volume %s is unmounted but is the source of a snapshot or clone in progress; it is removed on a retry once that is done", v.Name)
	}
	v.Phase = PhaseDeleting
	if err := d.Records.Volumes.Put(v); err != nil {
		return err
	}
	if err := d.removeVolumeData(v); err != nil {
		return fmt.Errorf("removing inline volume %s: %w", v.Name, err)
	}
	return d.Records.Volumes.Drop(v.ID)
}
