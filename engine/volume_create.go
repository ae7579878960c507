package engine

import (
	"context"
	"fmt"
	"time"
)

// VolumeSpec is a new volume as CreateVolume asks for it, its fields
// checked: what createVolume makes.
type VolumeSpec struct {
	Name, Access, Kind string
	// Layout is a mount volume's as its StorageClass names it:
	// LayoutDirectory or LayoutImage, or "" when the class names none
	// (then a restore or clone takes its source's layout, and a new
	// volume Config.DefaultLayout); "" for a block volume.
	Layout string
	// FSType is the file system an image volume is asked to hold
	// (FSExt4, FSXFS), "" when the class names none: then a copy holds
	// its source's and a new volume ext4.
	FSType   string
	Params   map[string]string
	Pool     *Pool
	Source   sourceRef
	Capacity SizeRange
	Mutable  map[string]string
}

// sourceRef is a restore's snapshot or a clone's volume: kind is
// sourceSnapshot or sourceVolume ("" for none), tag the node tag of the
// node it lives on when that is another one this driver can pull from.
type sourceRef struct{ kind, ID, Tag string }

// SourceOf is where a source of kind and id lives: here, or on the node
// whose tag it names.
func (d *Engine) SourceOf(kind, id string) sourceRef {
	tag, _ := d.remoteSource(id)
	return sourceRef{kind: kind, ID: id, Tag: tag}
}

// MakeVolume makes the volume spec asks for, or returns the one of its
// name if it is compatible. It takes the name's lock, pins a local source
// (it may not be deleted or changed while it is copied; it may be
// published, read or copied meanwhile) or asks a remote one's node what it
// is, sizes the volume no smaller than its source, and provisions it: a
// pull from another node goes on past the request (provisionPulled).
func (d *Engine) MakeVolume(ctx context.Context, spec VolumeSpec) (VolumeRecord, error) {
	if err := d.pulling(spec.Name); err != nil {
		return VolumeRecord{}, err
	}
	unlock, err := d.Locks.lock(fmt.Sprintf("volume %q", spec.Name), volNameKey(spec.Name))
	if err != nil {
		return VolumeRecord{}, err
	}
	// The lock goes with a pull from another node, which outlives this
	// request: then unlock is nil here.
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	src := spec.Source
	rec := VolumeRecord{Name: spec.Name, AccessType: spec.Access, Kind: spec.Kind, Parameters: spec.Params, Pool: recordPool(spec.Pool)}
	// A layout the class does not name is decided once, here: the
	// source's for a restore or clone (a clone is like what it clones,
	// also across an upgrade that changed --default-layout), else the
	// configured default.
	named := spec.Access != AccessMount || spec.Layout != ""
	layout := spec.Layout
	if !named {
		layout = d.sourceLayout(src)
	}
	layout = setLayout(&rec, layout)
	if layout == LayoutImage {
		rec.FSType = fsField(spec.FSType)
	}
	switch src.kind {
	case SourceSnapshot:
		rec.SourceSnapshot = src.ID
	case SourceVolume:
		rec.SourceVolume = src.ID
	}
	// The floor is the source's size: a restore or clone is never smaller.
	var floor int64
	switch {
	case src.Tag != "":
		// The source's node pins it while it is sent; here it is only
		// asked what it is, and not at all when the volume exists.
		if old, ok := d.Records.Volumes.ByName(spec.Name); ok {
			return d.existingVolume(old, rec, spec.Capacity, named)
		}
		var fs, node string
		if floor, layout, fs, node, err = d.statRemote(ctx, src.Tag, src.kind, src.ID, spec.Access, layout, named); err != nil {
			return VolumeRecord{}, err
		}
		layout = setLayout(&rec, layout)
		if layout == LayoutImage && fs != "" {
			// A copy holds what its source's image holds.
			if spec.FSType != "" && spec.FSType != fs {
				return VolumeRecord{}, StorageErr(ErrInvalid, "source %s %s on node %s holds %s; it cannot make a volume of csi.storage.k8s.io/fstype %s (a copy holds what its source holds)", src.kind, src.ID, node, fs, spec.FSType)
			}
			rec.FSType = fsField(fs)
		}
	case src.kind == SourceSnapshot:
		// One answered not ready is restored once made (a CO restores
		// only ready snapshots; csi-sanity restores at once).
		if err := d.awaitSnapshot(ctx, src.ID); err != nil {
			return VolumeRecord{}, err
		}
		unpin, err := d.pinSnapshot(src.ID)
		if err != nil {
			return VolumeRecord{}, err
		}
		defer unpin()
		s, ok := d.Records.Snapshots.Get(src.ID)
		if !ValidSnapshotID(src.ID) || !ok || s.Phase != PhaseReady {
			return VolumeRecord{}, StorageErr(ErrNotFound, "source snapshot %q does not exist", src.ID)
		}
		if err := restorable(s.ID, s.AccessType, snapshotLayout(s), spec.Access, layout); err != nil {
			return VolumeRecord{}, err
		}
		if err := d.snapshotPresent(s); err != nil {
			return VolumeRecord{}, err
		}
		if layout == LayoutImage && (s.AccessType == AccessBlock || s.Format == FormatImage) {
			if rec.FSType, err = copyFS("source snapshot "+s.ID, "cannot restore an image volume", d.SnapshotDataPath(s), spec.FSType); err != nil {
				return VolumeRecord{}, err
			}
		}
		// A restore needs room for what the snapshot holds.
		floor = s.SizeBytes
	case src.kind == SourceVolume:
		v, unpin, err := d.pinVolume(src.ID)
		if err != nil {
			return VolumeRecord{}, err
		}
		defer unpin()
		if v.AccessType != spec.Access {
			return VolumeRecord{}, StorageErr(ErrInvalid, "source volume %s is a %s volume; it cannot be cloned into a %s volume", v.ID, v.AccessType, spec.Access)
		}
		if got := layoutOf(v); got != layout {
			return VolumeRecord{}, StorageErr(ErrInvalid, "source volume %s has the %s layout; it cannot be cloned into a %s-layout volume (the StorageClass parameter %s)", v.ID, got, layout, ParamLayout)
		}
		if isImage(v) {
			if rec.FSType, err = copyFS("source volume "+v.ID, "cannot be cloned", d.VolumeDataPath(v), spec.FSType); err != nil {
				return VolumeRecord{}, err
			}
		}
		floor = v.CapacityBytes
	}
	// A request below the source's size gets the source's (resolveSize
	// raises it to the floor), as a create below an image's smallest file
	// system does: CSI lets a volume be larger than required_bytes within
	// limit_bytes, and a limit below the source is OutOfRange there.
	minSize, maxSize := imageLimits(makesFS(rec))
	if isImage(rec) {
		// An image volume holds a file system, which has a smallest size
		// (16 MiB for ext4, 300 MiB for XFS): a smaller request gets
		// that, as CSI lets a volume be larger than required_bytes within
		// limit_bytes.
		floor = max(floor, minSize)
	}
	if rec.CapacityBytes, err = d.resolveSize(spec.Capacity, spec.Access, floor); err != nil {
		return VolumeRecord{}, err
	}
	if isImage(rec) && rec.CapacityBytes > maxSize {
		return VolumeRecord{}, StorageErr(ErrOutOfRange, "an image volume holds at most %d bytes (16 TiB: its loop device and ext4's 32-bit block numbers); %d asked", maxSize, rec.CapacityBytes)
	}
	if err := checkIOLimitsFor(rec, spec.Mutable); err != nil {
		return VolumeRecord{}, err
	}
	applyMutable(&rec, spec.Mutable)
	if old, ok := d.Records.Volumes.ByName(spec.Name); ok {
		return d.existingVolume(old, rec, spec.Capacity, named)
	}
	if on, _, err := CheckStandbyParams(spec.Params); err != nil {
		return VolumeRecord{}, err
	} else if on {
		if rec.Standby, err = d.chooseStandby(ctx, spec.Name, rec, spec.Pool); err != nil {
			return VolumeRecord{}, err
		}
	}
	if src.Tag != "" {
		handed := unlock
		unlock = nil
		return d.provisionPulled(ctx, rec, src.Tag, handed)
	}
	return d.provisionVolume(ctx, rec, "")
}

// copyFS is the record's file system of a copy of src, whose image is at
// path: what that image holds. A class asking for another one (want; ""
// takes what it holds) is refused, as is an image holding neither ext4
// nor XFS (refusal says what src then cannot do).
func copyFS(src, refusal, path, want string) (string, error) {
	fs, err := probeFS(path)
	if err != nil {
		return "", StorageErr(ErrInvalid, "%s %s: %v", src, refusal, err)
	}
	if want != "" && want != fs {
		return "", StorageErr(ErrInvalid, "%s holds %s; it cannot make a volume of csi.storage.k8s.io/fstype %s (a copy holds what its source holds)", src, fs, want)
	}
	return fsField(fs), nil
}

// fsField is what a record keeps of file system fs: nothing for ext4.
func fsField(fs string) string {
	if fs == FSExt4 {
		return ""
	}
	return fs
}

// setLayout records layout for a new volume (only an image mount volume's
// is written: a directory's is the record's empty default) and returns
// the volume's layout as layoutOf says it.
func setLayout(v *VolumeRecord, layout string) string {
	v.Layout = ""
	if v.AccessType == AccessMount && layout == LayoutImage {
		v.Layout = LayoutImage
	}
	return layoutOf(*v)
}

// sourceLayout is the layout of a mount volume whose class names none: a
// local source's, where it is a mount volume or a snapshot of one, else
// Config.DefaultLayout. (A remote source's comes with its answer to
// statRemote.)
func (d *Engine) sourceLayout(src sourceRef) string {
	switch {
	case src.Tag != "":
	case src.kind == SourceSnapshot:
		if s, ok := d.Records.Snapshots.Get(src.ID); ok && s.AccessType == AccessMount {
			return snapshotLayout(s)
		}
	case src.kind == SourceVolume:
		if v, ok := d.Records.Volumes.Get(src.ID); ok && v.AccessType == AccessMount {
			return layoutOf(v)
		}
	}
	return d.Config.DefaultLayout
}

// existingVolume answers a repeated CreateVolume: the same volume if the
// request is compatible, ErrExists saying what differs if not. A layout
// the request did not name (layoutNamed false) is whatever the volume has.
func (d *Engine) existingVolume(old, want VolumeRecord, cr SizeRange, layoutNamed bool) (VolumeRecord, error) {
	if old.Phase != PhaseReady {
		return VolumeRecord{}, StorageErr(ErrBusy, "volume %q is being %s; retry later", old.Name, old.Phase)
	}
	var diff string
	switch {
	case old.AccessType != want.AccessType:
		diff = fmt.Sprintf("it is a %s volume, the request asks for %s", old.AccessType, want.AccessType)
	case layoutNamed && layoutOf(old) != layoutOf(want):
		diff = fmt.Sprintf("it has the %s layout, the request asks for %s", layoutOf(old), layoutOf(want))
	case isImage(old) && want.FSType != "" && old.FSType != want.FSType:
		diff = fmt.Sprintf("it holds %s, the request asks for %s", makesFS(old), want.FSType)
	case old.CapacityBytes < cr.Required:
		diff = fmt.Sprintf("it has %d bytes, the request requires %d", old.CapacityBytes, cr.Required)
	case cr.Limit > 0 && old.CapacityBytes > cr.Limit:
		diff = fmt.Sprintf("it has %d bytes, the request limits it to %d", old.CapacityBytes, cr.Limit)
	case old.SourceSnapshot != want.SourceSnapshot || old.SourceVolume != want.SourceVolume:
		diff = "it was created from a different content source"
	case old.Kind != want.Kind && want.Kind != "":
		diff = fmt.Sprintf("it is of kind %q, the request asks for %q", old.Kind, want.Kind)
	default:
		return old, nil
	}
	return VolumeRecord{}, StorageErr(ErrExists, "volume %q already exists as %s and is incompatible: %s", old.Name, old.ID, diff)
}

// provisionVolume takes a new volume through the create protocol: reserve
// it (capacity checked under the index lock), record it "creating", make
// its data, record it "ready". A failure undoes what it can; what it cannot
// stays "creating" for the next start to clear.
func (d *Engine) provisionVolume(ctx context.Context, rec VolumeRecord, tag string) (VolumeRecord, error) {
	rec.ID = d.NewVolumeID()
	rec.Phase = PhaseCreating
	rec.CreatedAt = time.Now().UTC()
	// An empty block volume's backing file is made durable when a pod
	// first gets it (settleBlock), not here: that spares a create an
	// fsync.
	rec.Fresh = rec.AccessType == AccessBlock && rec.SourceSnapshot == "" && rec.SourceVolume == ""
	if rec.Fresh {
		return d.provisionFreshBlock(ctx, rec)
	}
	if isImage(rec) {
		// Durable before the first image record: a release that knows
		// no images refuses the state dir rather than misread them.
		if err := d.raiseStateFormat(formatImages); err != nil {
			return VolumeRecord{}, fmt.Errorf("state dir %s: recording that it holds image volumes: %w", d.Paths.Root, err)
		}
	}
	release := d.holdPools(rec.Pool, d.sourcePool(rec))
	defer release()
	return d.volumes().create(rec, d.checkCapacity, func(rec VolumeRecord) (VolumeRecord, error) {
		err := d.createVolumeData(ctx, rec, tag)
		if err == nil {
			err = d.layoutFor(rec).syncData(rec)
		}
		if err != nil {
			return VolumeRecord{}, fmt.Errorf("creating volume %q: %w", rec.Name, err)
		}
		rec.Phase = PhaseReady
		return rec, nil
	})
}

// sourcePool is the pool of v's source on this node (its snapshot's or
// its volume's), "" (the default) when it has none.
func (d *Engine) sourcePool(v VolumeRecord) string {
	if s, ok := d.Records.Snapshots.Get(v.SourceSnapshot); ok {
		return s.Pool
	}
	if src, ok := d.Records.Volumes.Get(v.SourceVolume); ok {
		return src.Pool
	}
	return ""
}

// volumes is the create protocol of volumes (creation.create).
func (d *Engine) volumes() creation[VolumeRecord] {
	return creation[VolumeRecord]{table: d.Records.Volumes, kind: "volume", undo: d.removeVolumeData}
}

// provisionFreshBlock makes an empty block volume. It needs no
// "creating" record: whichever of the ready record and the backing file a
// crash leaves, start repairs it (a fresh volume's missing file is made
// again; a file without a record that holds no written data, which is all
// a file no pod ever had can hold, is removed with its loop device). So
// the record's journal commit and the file's creation and loop attach run
// side by side, and the record is shown only once both are done.
func (d *Engine) provisionFreshBlock(ctx context.Context, rec VolumeRecord) (VolumeRecord, error) {
	release := d.holdPools(rec.Pool)
	defer release()
	if err := d.Records.Volumes.Reserve(&rec, d.checkCapacity); err != nil {
		return VolumeRecord{}, fmt.Errorf("reserving volume %q: %w", rec.Name, err)
	}
	rec.Phase = PhaseReady
	recorded := make(chan error, 1)
	go func() { recorded <- d.Records.Volumes.PutUnindexed(rec) }()
	dataErr := d.createVolumeData(ctx, rec, "")
	putErr := <-recorded
	if dataErr == nil && putErr == nil {
		d.Records.Volumes.Index(rec)
		return rec, nil
	}
	// With its data gone, a record that could not be dropped (or was
	// never written) gives its name back; with the data left, the record
	// stays for DeleteVolume or the next start to finish.
	if d.volumes().takeBack(rec) {
		d.Records.Volumes.Unreserve(rec.ID)
	}
	if dataErr != nil {
		return VolumeRecord{}, fmt.Errorf("creating volume %q: %w", rec.Name, dataErr)
	}
	return VolumeRecord{}, fmt.Errorf("recording volume %s: %w", rec.ID, putErr)
}
