package engine

import "context"

// MountRequest is what a stage or a publish asks of a volume on this
// node, past the paths.
type MountRequest struct {
	// Access is the capability's access type: AccessMount or AccessBlock.
	Access string
	// FSType is the file system the capability asks an image volume to
	// hold ("": any).
	FSType string
	// Context is the volume context: an inline or local volume it
	// describes is made first if it is not there yet.
	Context map[string]string
}

// Stage stages volume id at staging under the volume's lock. A volume
// this node keeps the standby copy of is promoted first if its primary
// is fenced (takeOver), else refused; one of another node is refused
// (ErrElsewhere).
func (d *Engine) Stage(ctx context.Context, id, staging string, r MountRequest) error {
	if err := d.takeOver(ctx, id); err != nil {
		return err
	}
	if tag, other := d.OtherNode(id); other {
		return StorageErr(ErrElsewhere, "volume_id %s lives on another node (%s); node-local volumes and snapshots are reachable only there, so the work must run on that node", id, tag)
	}
	v, unlock, err := d.volumeForMount(ctx, id, r)
	if err != nil {
		return err
	}
	defer unlock()
	return d.stageVolume(v, staging)
}

// Publish publishes volume id at target under the volume's lock, with
// the mount flags (fsops) asked, read-only where asked, and for a single
// writer where the access mode says so.
func (d *Engine) Publish(ctx context.Context, id, target string, r MountRequest, flags uintptr, readOnly, single bool) error {
	v, unlock, err := d.volumeForMount(ctx, id, r)
	if err != nil {
		return err
	}
	defer unlock()
	return d.publishVolume(v, target, flags, readOnly, single)
}

// volumeForMount locks volume id (made first if the request's context
// describes an inline or local one) and checks that it is of the access
// type asked, that its data is there and that an image volume holds the
// file system asked. The caller unlocks.
func (d *Engine) volumeForMount(ctx context.Context, id string, r MountRequest) (VolumeRecord, func(), error) {
	v, unlock, err := d.nodeVolumeOrProvision(ctx, id, r.Context, r.Access)
	if err != nil {
		return VolumeRecord{}, nil, err
	}
	refuse := func(err error) (VolumeRecord, func(), error) {
		unlock()
		return VolumeRecord{}, nil, err
	}
	if r.Access != v.AccessType {
		return refuse(StorageErr(ErrInvalid, "volume %s is a %s volume; the capability asks for %s", v.ID, v.AccessType, r.Access))
	}
	if err := d.dataPresent(v); err != nil {
		return refuse(err)
	}
	if v.Layout == LayoutImage {
		if err := d.HoldsFS(v, r.FSType); err != nil {
			return refuse(err)
		}
	}
	return v, unlock, nil
}

// HoldsFS refuses (ErrInvalid) an image volume whose file system is not
// want; "" wants any.
func (d *Engine) HoldsFS(v VolumeRecord, want string) error {
	if want == "" {
		return nil
	}
	has, err := d.ImageFS(v)
	if err != nil {
		return err
	}
	if has != want {
		return StorageErr(ErrInvalid, "volume %s holds %s; the capability's fs_type asks for %s", v.ID, has, want)
	}
	return nil
}
