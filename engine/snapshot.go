package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"time"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/fsops"
	"k8s.io/klog/v2"
)

// paramDeletionPolicy is a snapshot or group class parameter this driver
// takes and ignores (see SnapshotOptions).
const paramDeletionPolicy = "deletionPolicy"

// Snapshot formats.
const (
	FormatTarGz   = "tar.gz"  // portable archive of a directory volume
	FormatTarZst  = "tar.zst" // the same, zstd-compressed (compression: zstd)
	FormatReflink = "reflink" // reflinked copy of a directory volume
	FormatImage   = "img"     // extent or reflink copy of a block volume's file
)

// Snapshot parameters (VolumeSnapshotClass).
const (
	ParamFormat      = "format"      // auto (default), tar.gz or reflink
	ParamCompression = "compression" // fast (default) or compact for tar.gz, or zstd for tar.zst
)

// SnapshotOptions reads and checks the parameters of CreateSnapshot for a
// volume of layout (LayoutDirectory, LayoutImage, or "" for a block
// volume) in pool src (nil: only checking the parameters): the format,
// and the pool the snapshot goes to (the pool parameter, else src's). A
// reflink shares blocks, so it needs the snapshot in the volume's pool on
// a file system that can.
func (d *Engine) SnapshotOptions(params map[string]string, layout string, src *Pool) (format string, compact bool, dst *Pool, err error) {
	checking := src == nil // the volume, and so what its pool can do, is not known yet
	if checking {
		src = d.Pools[DefaultPool]
	}
	dst = src
	if params[ParamPool] != "" {
		if dst, err = d.ChoosePool(params); err != nil {
			return "", false, nil, err
		}
	}
	canReflink := dst == src && dst.Get().Reflink
	format = FormatTarGz
	if canReflink {
		format = FormatReflink
	}
	zstd := false
	for k, v := range params {
		switch {
		case k == ParamPool:
		case k == ParamFormat:
			switch v {
			case "", "auto":
			case FormatTarGz:
				format = FormatTarGz
			case FormatReflink:
				if checking {
					format = FormatReflink
					break
				}
				if dst != src {
					return "", false, nil, StorageErr(ErrInvalid, "parameter %s=%s: a reflink shares the volume's blocks, so it cannot go to pool %s from pool %s; use %s", k, v, dst.Name, src.Name, FormatTarGz)
				}
				if !canReflink {
					return "", false, nil, StorageErr(ErrInvalid, "parameter %s=%s: pool %s's file system cannot share blocks (XFS with reflink=1 or btrfs can); use %s", k, v, dst.Name, FormatTarGz)
				}
				format = FormatReflink
			default:
				return "", false, nil, StorageErr(ErrInvalid, "parameter %s=%q: want auto, %s or %s", k, v, FormatTarGz, FormatReflink)
			}
		case k == ParamCompression:
			switch v {
			case "", "fast":
			case "compact":
				compact = true
			case "zstd":
				zstd = true
			default:
				return "", false, nil, StorageErr(ErrInvalid, "parameter %s=%q: want fast, compact or zstd", k, v)
			}
		case strings.HasPrefix(k, CoParamPrefix):
		case k == paramDeletionPolicy:
			// The Kubernetes e2e framework copies a class's deletionPolicy
			// into its parameters (storageframework's group snapshot
			// resources do): it is the CO's business, not a choice here.
		default:
			return "", false, nil, StorageErr(ErrInvalid, "unknown snapshot parameter %q; this driver accepts %q, %q and %q", k, ParamFormat, ParamCompression, ParamPool)
		}
	}
	// zstd asks for an archive: tar.zst, unless the format says reflink,
	// which has nothing to compress.
	if zstd {
		if params[ParamFormat] == FormatReflink {
			return "", false, nil, StorageErr(ErrInvalid, "parameter %s=zstd compresses archives; %s=%s makes none (use %s=auto or %s)", ParamCompression, ParamFormat, FormatReflink, ParamFormat, FormatTarGz)
		}
		format = FormatTarZst
	}
	switch layout {
	case "": // a block volume's file
		format = FormatImage
	case LayoutImage:
		// Its image, cut at one instant, unless an archive is asked for
		// by name (an export of its tree, as of that instant too);
		// compression tunes archives, so one class serves volumes of
		// both layouts.
		switch params[ParamFormat] {
		case "", "auto":
			format = FormatImage
		case FormatTarGz:
		default:
			return "", false, nil, StorageErr(ErrInvalid, "an image volume's snapshots are copies of its image (%s=auto) or archives of its tree (%s=%s); %s=%s is for directory volumes", ParamFormat, ParamFormat, FormatTarGz, ParamFormat, params[ParamFormat])
		}
	}
	return format, compact, dst, nil
}

// MakeSnapshot snapshots volume srcID as name, or returns the snapshot
// of that name if it is of the same volume. The name's lock is held
// throughout; the volume is pinned (it may be read and published
// meanwhile, not deleted or expanded). The snapshot is made in the
// background, past the request (snapshotInBackground).
func (d *Engine) MakeSnapshot(ctx context.Context, name, srcID string, params map[string]string) (SnapshotRecord, error) {
	if rec, ok, err := d.snapshotting(name, srcID); ok {
		return rec, err
	}
	unlock, err := d.Locks.lock(fmt.Sprintf("snapshot %q", name), snapNameKey(name))
	if err != nil {
		return SnapshotRecord{}, err
	}
	if old, ok := d.Records.Snapshots.ByName(name); ok {
		unlock()
		if old.SourceVolume != srcID {
			return SnapshotRecord{}, StorageErr(ErrExists, "snapshot %q already exists as %s of volume %s, not of %s", name, old.ID, old.SourceVolume, srcID)
		}
		return old, nil
	}
	_, unpin, err := d.pinVolume(srcID)
	if err != nil {
		unlock()
		return SnapshotRecord{}, err
	}
	return d.snapshotInBackground(ctx, name, srcID, params, func() { unpin(); unlock() })
}

// takeSnapshot snapshots a volume; the caller holds the lock of the name
// and has pinned the volume. cut hears of the snapshot, not ready yet, once
// its instant is fixed. A failure leaves no data and no record.
func (d *Engine) takeSnapshot(ctx context.Context, name, srcID string, reqParams map[string]string, cut func(SnapshotRecord)) (SnapshotRecord, error) {
	p, err := d.prepareSnapshot(ctx, name, srcID, reqParams, "")
	if err != nil {
		return SnapshotRecord{}, err
	}
	release, err := d.Heavy.Wait(ctx)
	if err != nil {
		return p.complete(err)
	}
	defer release()
	err = d.frozen(ctx, []VolumeRecord{p.v}, p.cut)
	if err == nil {
		cut(p.cutRecord())
	}
	return p.complete(err)
}

// pendingSnapshot is a snapshot between its creating record and its
// ready one, made in steps so that what runs while its volume's file
// system is frozen is the copy alone (cut): its slot and its record come
// before the freeze (prepareSnapshot), an archive of the copy after the
// thaw (complete). A group's members are each prepared, all cut in one
// freeze, then each completed.
type pendingSnapshot struct {
	d       *Engine
	v       VolumeRecord
	s       SnapshotRecord
	compact bool
	// ctx is the caller's, tracked: the snapshot's progress is reported
	// while it runs, until done.
	ctx  context.Context
	done func()
	// rest is what cut leaves for after the thaw (nil until cut).
	rest snapshotRest
	// at is the snapshot's instant: when its cut began, in its freeze.
	at time.Time
}

// cutRecord is the snapshot as its cut leaves it: its instant fixed, not
// ready yet; its size is the volume's for a copy of an image (what a
// restore needs), unknown for an archive until it is written.
func (p *pendingSnapshot) cutRecord() SnapshotRecord {
	s := p.s
	s.CreatedAt = p.at
	if s.Format == FormatImage {
		s.SizeBytes = s.VolumeBytes
	}
	return s
}

// snapshotRest is what a snapshot's cut leaves to do after the thaw:
// finish it, or, if the snapshot is abandoned, let go of what the cut made
// (abort).
type snapshotRest func(ctx context.Context, abort bool) (size int64, sum string, err error)

// restDone is the rest of a cut that made the whole snapshot.
func restDone(size int64, sum string) snapshotRest {
	return func(context.Context, bool) (int64, string, error) { return size, sum, nil }
}

// prepareSnapshot checks a snapshot of volume srcID and records it
// creating.
func (d *Engine) prepareSnapshot(ctx context.Context, name, srcID string, reqParams map[string]string, group string) (*pendingSnapshot, error) {
	v, ok := d.Records.Volumes.Get(srcID)
	if !ValidVolumeID(srcID) || !ok || v.Phase != PhaseReady {
		return nil, StorageErr(ErrNotFound, "source volume %q does not exist", srcID)
	}
	// The volume's mutable parameters fill in what the class leaves out.
	params := maps.Clone(reqParams)
	if params == nil {
		params = map[string]string{}
	}
	if f, ok := v.Mutable[MutableSnapshotFormat]; ok && params[ParamFormat] == "" {
		params[ParamFormat] = f
	}
	if c, ok := v.Mutable[MutableSnapshotCompression]; ok && params[ParamCompression] == "" {
		params[ParamCompression] = c
	}
	format, compact, dst, err := d.SnapshotOptions(params, layoutOf(v), d.PoolOf(v.Pool))
	if err != nil {
		return nil, err
	}
	if v.AccessType == AccessMount && !isImage(v) && len(v.Published) > 0 {
		klog.InfoS("snapshot of a directory volume in use: a file-by-file copy while its pods write, not one instant (layout=image volumes are frozen for theirs)", "volume_id", v.ID, "published", len(v.Published))
	}
	release := d.holdPools(v.Pool, recordPool(dst))
	if _, err := d.usable(dst); err != nil {
		release()
		return nil, err
	}
	s := SnapshotRecord{
		ID: d.newSnapshotID(), Name: name, SourceVolume: srcID, AccessType: v.AccessType,
		Phase: PhaseCreating, CreatedAt: time.Now().UTC(), VolumeBytes: v.CapacityBytes, Format: format, Group: group,
		Pool: recordPool(dst), Owner: snapshotOwner(reqParams, group),
	}
	if err := d.snapshots().begin(&s, nil); err != nil {
		release()
		return nil, err
	}
	p := &pendingSnapshot{d: d, v: v, s: s, compact: compact}
	var untrack func()
	p.ctx, untrack = d.track(ctx, "snapshot", s.ID, d.layoutFor(v).expectedBytes(v))
	p.done = func() { untrack(); release() }
	return p, nil
}

// cut makes what must be made while the volume is frozen: the copy.
func (p *pendingSnapshot) cut(ctx context.Context) error {
	// p.ctx carries the snapshot's progress; ctx is frozen's, cancelled
	// when the freeze overruns its bound: the copy stops on either.
	p.at = time.Now().UTC()
	cctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	rest, err := p.d.layoutFor(p.v).cutSnapshot(cctx, p.v, p.s, p.compact)
	if err != nil {
		return fmt.Errorf("snapshotting volume %s: %w", p.v.ID, err)
	}
	p.rest = rest
	return nil
}

// complete finishes the snapshot after the thaw and records it ready or,
// if err (the snapshot failed before), takes it back.
func (p *pendingSnapshot) complete(err error) (SnapshotRecord, error) {
	defer p.done()
	var size int64
	var sum string
	if p.rest != nil {
		var rerr error
		size, sum, rerr = p.rest(p.ctx, err != nil)
		if err == nil && rerr != nil {
			err = fmt.Errorf("snapshotting volume %s: %w", p.v.ID, rerr)
		}
	}
	s := p.s
	if !p.at.IsZero() {
		s.CreatedAt = p.at
	}
	s.Phase, s.SizeBytes, s.SHA256 = PhaseReady, size, sum
	if s.Format == FormatImage {
		// A block or image restore needs the whole device, whatever is
		// allocated.
		s.SizeBytes = s.VolumeBytes
		// Its checksum at rest, read after the thaw: a restore or a
		// send checks it, as an archive's sha256 is.
		if err == nil {
			if s.DataSum, err = dataSum(p.d.SnapshotDataPath(s)); err != nil {
				err = fmt.Errorf("summing snapshot %s: %w", s.ID, err)
			}
		}
	}
	return p.d.snapshots().end(p.s, s, err)
}

// snapshots is the create protocol of snapshots (creation.create).
func (d *Engine) snapshots() creation[SnapshotRecord] {
	return creation[SnapshotRecord]{table: d.Records.Snapshots, kind: "snapshot", undo: d.removeSnapshotData}
}

// writeArchive archives tree into snapshot s's file (tar.gz, or tar.zst
// for FormatTarZst), made durable before it is renamed into place. It
// returns the bytes of file data archived and the archive's sha256.
func (d *Engine) writeArchive(ctx context.Context, tree string, s SnapshotRecord, compact bool) (int64, string, error) {
	h := sha256.New()
	var st archive.Stats
	err := fsops.CreateDurable(d.SnapshotDataPath(s), d.snapshotTempPath(s), 0o600, func(f *os.File) error {
		var err error
		st, err = archive.Write(ctx, tree, io.MultiWriter(f, h), archive.Options{Compact: compact, Zstd: s.Format == FormatTarZst})
		d.moved("archive", st.Bytes)
		return err
	})
	if err != nil {
		return 0, "", err
	}
	return st.DataBytes, hex.EncodeToString(h.Sum(nil)), nil
}

// writeReflinkSnapshot makes the snapshot a reflinked copy of the volume:
// blocks are shared, so it costs metadata only, and the copy is made
// durable with one syncfs(2) before it is renamed into place.
func (d *Engine) writeReflinkSnapshot(ctx context.Context, v VolumeRecord, s SnapshotRecord) (int64, error) {
	tmp := d.snapshotTempPath(s)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return 0, err
	}
	cst, err := fsops.CopyTree(ctx, d.VolumeDataPath(v), tmp)
	d.moved("archive", cst.Bytes)
	if err != nil {
		return 0, err
	}
	u, err := fsops.TreeUsage(tmp)
	if err != nil {
		return 0, err
	}
	if err := fsops.SyncFS(tmp); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, d.SnapshotDataPath(s)); err != nil {
		return 0, err
	}
	return u.Bytes, fsops.SyncDir(d.PoolOf(s.Pool).Paths.Snapshots())
}

// restoreSnapshot fills dir from a snapshot and checks the archive's
// checksum; a mismatch or a damaged archive is DataLoss.
func (d *Engine) restoreSnapshot(ctx context.Context, snapID, dir string) error {
	s, ok := d.Records.Snapshots.Get(snapID)
	if !ok {
		return StorageErr(ErrNotFound, "snapshot %s disappeared", snapID)
	}
	if s.Format == FormatReflink {
		st, err := fsops.CopyTree(ctx, d.SnapshotDataPath(s), dir)
		d.moved("restore", st.Bytes)
		return err
	}
	f, err := os.Open(d.SnapshotDataPath(s))
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	tee := io.TeeReader(f, h)
	st, err := archive.Extract(ctx, tee, dir)
	d.moved("restore", st.Bytes)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); s.SHA256 != "" && got != s.SHA256 {
		return fmt.Errorf("%w: %s has sha256 %s, recorded %s", ErrCorrupt, s.ID, got, s.SHA256)
	}
	return nil
}

// DeleteSnapshot removes snapshot id: one answered not ready and still
// being made is stopped first, then it is removed under its lock. A
// malformed id or one with no record is already deleted (nil); a member
// of a group snapshot is refused (the group is deleted whole).
func (d *Engine) DeleteSnapshot(ctx context.Context, id string) error {
	if err := d.stopSnapshot(ctx, id); err != nil {
		return err
	}
	s, unlock, err := lockForDelete(d, "snapshot", id, ValidSnapshotID, SnapIDKey, d.Records.Snapshots)
	if err != nil || unlock == nil {
		return err
	}
	defer unlock()
	if s.Group != "" {
		return StorageErr(ErrInUse, "snapshot %s belongs to group snapshot %s; delete the group instead", id, s.Group)
	}
	return d.removeSnapshot(s)
}

// removeSnapshot removes a snapshot's data and record; the caller holds
// its lock.
func (d *Engine) removeSnapshot(s SnapshotRecord) error {
	id := s.ID
	release := d.holdPools(s.Pool)
	defer release()
	if err := d.snapshotPoolUp(s); err != nil {
		return err
	}
	s.Phase = PhaseDeleting
	if err := d.Records.Snapshots.Put(s); err != nil {
		return fmt.Errorf("recording deletion of snapshot %s: %w", id, err)
	}
	if err := d.removeSnapshotData(s); err != nil {
		return fmt.Errorf("removing snapshot %s: %w", id, err)
	}
	// A disk that went away meanwhile "removed" nothing: the record
	// stays deleting, and the pool finishes it when it is back.
	if err := d.snapshotPoolUp(s); err != nil {
		return err
	}
	if err := d.Records.Snapshots.Drop(id); err != nil {
		return fmt.Errorf("removing record of snapshot %s: %w", id, err)
	}
	return nil
}

// HoldsSnapshot says whether the snapshot with this id is ready on this
// node: what an imported VolumeSnapshotContent's handle must name for this
// node's snapshotter to take it.
func (d *Engine) HoldsSnapshot(id string) bool {
	s, ok := d.Records.Snapshots.Get(id)
	return ok && s.Phase == PhaseReady
}

// dataSum is fsops.DataSum of the file at path.
func dataSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return fsops.DataSum(f)
}

// checkDataSum checks an image snapshot's file against its checksum at
// rest, where it has one; a mismatch is ErrCorrupt (DataLoss).
func (d *Engine) checkDataSum(s SnapshotRecord) error {
	if s.Format != FormatImage || s.DataSum == "" {
		return nil
	}
	got, err := dataSum(d.SnapshotDataPath(s))
	if err != nil {
		return fmt.Errorf("reading snapshot %s to check it: %w", s.ID, err)
	}
	if got != s.DataSum {
		return fmt.Errorf("%w: %s's data sums to %s, recorded %s", ErrCorrupt, s.ID, got, s.DataSum)
	}
	return nil
}
