package csi

import (
	"context"
	"fmt"
	"time"
)

// volumeSpec is a new volume as CreateVolume asks for it, its fields
// checked: what createVolume makes.
type volumeSpec struct {
	name, access, kind string
	params             map[string]string
	pool               *pool
	source             sourceRef
	capacity           sizeRange
	mutable            map[string]string
}

// sourceRef is a restore's snapshot or a clone's volume: kind is
// sourceSnapshot or sourceVolume ("" for none), tag the node tag of the
// node it lives on when that is another one this driver can pull from.
type sourceRef struct{ kind, id, tag string }

// sourceOf is where a source of kind and id lives: here, or on the node
// whose tag it names.
func (d *engine) sourceOf(kind, id string) sourceRef {
	tag, _ := d.remoteSource(id)
	return sourceRef{kind: kind, id: id, tag: tag}
}

// createVolume makes the volume spec asks for, or returns the one of its
// name if it is compatible. It takes the name's lock, pins a local source
// (it may not be deleted or changed while it is copied; it may be
// published, read or copied meanwhile) or asks a remote one's node what it
// is, sizes the volume no smaller than its source, and provisions it: a
// pull from another node goes on past the request (provisionPulled).
func (d *engine) createVolume(ctx context.Context, spec volumeSpec) (volumeRecord, error) {
	if err := d.pulling(spec.name); err != nil {
		return volumeRecord{}, err
	}
	unlock, err := d.locks.lock(fmt.Sprintf("volume %q", spec.name), volNameKey(spec.name))
	if err != nil {
		return volumeRecord{}, err
	}
	// The lock goes with a pull from another node, which outlives this
	// request: then unlock is nil here.
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	src := spec.source
	rec := volumeRecord{Name: spec.name, AccessType: spec.access, Kind: spec.kind, Parameters: spec.params, Pool: recordPool(spec.pool)}
	switch src.kind {
	case sourceSnapshot:
		rec.SourceSnapshot = src.id
	case sourceVolume:
		rec.SourceVolume = src.id
	}
	// The floor is the source's size: a restore or clone is never smaller.
	var floor int64
	switch {
	case src.tag != "":
		// The source's node pins it while it is sent; here it is only
		// asked what it is, and not at all when the volume exists.
		if old, ok := d.st.Volumes.ByName(spec.name); ok {
			return d.existingVolume(old, rec, spec.capacity)
		}
		if floor, err = d.statRemote(ctx, src.tag, src.kind, src.id, spec.access); err != nil {
			return volumeRecord{}, err
		}
	case src.kind == sourceSnapshot:
		unpin, err := d.pinSnapshot(src.id)
		if err != nil {
			return volumeRecord{}, err
		}
		defer unpin()
		s, ok := d.st.Snapshots.Get(src.id)
		if !validSnapshotID(src.id) || !ok || s.Phase != phaseReady {
			return volumeRecord{}, storageErr(ErrNotFound, "source snapshot %q does not exist", src.id)
		}
		if s.AccessType != spec.access {
			return volumeRecord{}, storageErr(ErrInvalid, "source snapshot %s is of a %s volume; it cannot restore a %s volume", s.ID, s.AccessType, spec.access)
		}
		if err := d.snapshotPresent(s); err != nil {
			return volumeRecord{}, err
		}
		// A restore needs room for what the snapshot holds.
		floor = s.SizeBytes
	case src.kind == sourceVolume:
		v, unpin, err := d.pinVolume(src.id)
		if err != nil {
			return volumeRecord{}, err
		}
		defer unpin()
		if v.AccessType != spec.access {
			return volumeRecord{}, storageErr(ErrInvalid, "source volume %s is a %s volume; it cannot be cloned into a %s volume", v.ID, v.AccessType, spec.access)
		}
		floor = v.CapacityBytes
	}
	if req := spec.capacity.required; req > 0 && req < floor {
		return volumeRecord{}, storageErr(ErrOutOfRange, "requested %d bytes is smaller than the source's %d bytes", req, floor)
	}
	if rec.CapacityBytes, err = d.resolveSize(spec.capacity, spec.access, floor); err != nil {
		return volumeRecord{}, err
	}
	applyMutable(&rec, spec.mutable)
	if old, ok := d.st.Volumes.ByName(spec.name); ok {
		return d.existingVolume(old, rec, spec.capacity)
	}
	if src.tag != "" {
		handed := unlock
		unlock = nil
		return d.provisionPulled(ctx, rec, src.tag, handed)
	}
	return d.provisionVolume(ctx, rec, "")
}

// existingVolume answers a repeated CreateVolume: the same volume if the
// request is compatible, ErrExists saying what differs if not.
func (d *engine) existingVolume(old, want volumeRecord, cr sizeRange) (volumeRecord, error) {
	if old.Phase != phaseReady {
		return volumeRecord{}, storageErr(ErrBusy, "volume %q is being %s; retry later", old.Name, old.Phase)
	}
	var diff string
	switch {
	case old.AccessType != want.AccessType:
		diff = fmt.Sprintf("it is a %s volume, the request asks for %s", old.AccessType, want.AccessType)
	case old.CapacityBytes < cr.required:
		diff = fmt.Sprintf("it has %d bytes, the request requires %d", old.CapacityBytes, cr.required)
	case cr.limit > 0 && old.CapacityBytes > cr.limit:
		diff = fmt.Sprintf("it has %d bytes, the request limits it to %d", old.CapacityBytes, cr.limit)
	case old.SourceSnapshot != want.SourceSnapshot || old.SourceVolume != want.SourceVolume:
		diff = "it was created from a different content source"
	case old.Kind != want.Kind && want.Kind != "":
		diff = fmt.Sprintf("it is of kind %q, the request asks for %q", old.Kind, want.Kind)
	default:
		return old, nil
	}
	return volumeRecord{}, storageErr(ErrExists, "volume %q already exists as %s and is incompatible: %s", old.Name, old.ID, diff)
}

// provisionVolume takes a new volume through the create protocol: reserve
// it (capacity checked under the index lock), record it "creating", make
// its data, record it "ready". A failure undoes what it can; what it cannot
// stays "creating" for the next start to clear.
func (d *engine) provisionVolume(ctx context.Context, rec volumeRecord, tag string) (volumeRecord, error) {
	rec.ID = d.newVolumeID()
	rec.Phase = phaseCreating
	rec.CreatedAt = time.Now().UTC()
	// An empty block volume's backing file is made durable when a pod
	// first gets it (settleBlock), not here: that spares a create an
	// fsync.
	rec.Fresh = rec.AccessType == accessBlock && rec.SourceSnapshot == "" && rec.SourceVolume == ""
	if rec.Fresh {
		return d.provisionFreshBlock(ctx, rec)
	}
	return d.volumes().create(rec, d.checkCapacity, func(rec volumeRecord) (volumeRecord, error) {
		err := d.createVolumeData(ctx, rec, tag)
		if err == nil {
			err = d.syncVolumeData(rec)
		}
		if err != nil {
			return volumeRecord{}, fmt.Errorf("creating volume %q: %w", rec.Name, err)
		}
		rec.Phase = phaseReady
		return rec, nil
	})
}

// volumes is the create protocol of volumes (creation.create).
func (d *engine) volumes() creation[volumeRecord] {
	return creation[volumeRecord]{table: d.st.Volumes, kind: "volume", undo: d.removeVolumeData}
}

// provisionFreshBlock makes an empty block volume. It needs no
// "creating" record: whichever of the ready record and the backing file a
// crash leaves, start repairs it (a fresh volume's missing file is made
// again; a file without a record that holds no written data, which is all
// a file no pod ever had can hold, is removed with its loop device). So
// the record's journal commit and the file's creation and loop attach run
// side by side, and the record is shown only once both are done.
func (d *engine) provisionFreshBlock(ctx context.Context, rec volumeRecord) (volumeRecord, error) {
	if err := d.st.Volumes.Reserve(&rec, d.checkCapacity); err != nil {
		return volumeRecord{}, fmt.Errorf("reserving volume %q: %w", rec.Name, err)
	}
	rec.Phase = phaseReady
	recorded := make(chan error, 1)
	go func() { recorded <- d.st.Volumes.PutUnindexed(rec) }()
	dataErr := d.createVolumeData(ctx, rec, "")
	putErr := <-recorded
	if dataErr == nil && putErr == nil {
		d.st.Volumes.Index(rec)
		return rec, nil
	}
	// With its data gone, a record that could not be dropped (or was
	// never written) gives its name back; with the data left, the record
	// stays for DeleteVolume or the next start to finish.
	if d.volumes().takeBack(rec) {
		d.st.Volumes.Unreserve(rec.ID)
	}
	if dataErr != nil {
		return volumeRecord{}, fmt.Errorf("creating volume %q: %w", rec.Name, dataErr)
	}
	return volumeRecord{}, fmt.Errorf("recording volume %s: %w", rec.ID, putErr)
}
