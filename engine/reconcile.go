package engine

import (
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
)

// reconcile makes the state and the disk agree after a restart or a crash,
// and logs every repair. The create and delete protocols write a record
// before touching data, so:
//   - a record still "creating" or "deleting" is an operation the crash
//     interrupted: its data is removed and so is the record (a retried
//     CreateVolume starts again from nothing);
//   - a ready record whose data is missing is kept: the disk holding it may
//     mount late, or the directory come back from a backup. Health
//     reports it and publish refuses it, naming the path, until the data is
//     back; deleting it removes the record;
//   - data under a valid id with no record belongs to no volume: removed;
//   - tmp/ holds only unfinished work: emptied.
//
// Start does this for the default pool (the state dir); each other pool
// gets it when it comes up (reconcilePool), and until then its records
// are left as they are.
func (d *Engine) reconcile() error {
	home, err := d.volumesDirIsHome()
	if err != nil {
		return err
	}
	for _, note := range d.Records.Notes() {
		klog.ErrorS(nil, "repair: "+note)
	}
	for _, bad := range d.Records.Damaged() {
		klog.ErrorS(nil, "a state record is damaged; its data is kept and its id refused until the record is repaired: restore the file from a backup (the data is at the path named), or move the file and the data away to give up the volume or snapshot",
			"id", bad.ID, "record", bad.Path, "problem", bad.Problem, "data", d.dataOf(bad.ID))
	}
	def := d.Pools[DefaultPool]
	if err := d.reconcileRecords(def, home); err != nil {
		return err
	}
	return d.reconcileDirs(def)
}

// reconcilePool is reconcile for a pool other than the default as it comes
// up: its marker proves its volumes directory is the volumes' home.
func (d *Engine) reconcilePool(p *Pool) error {
	if err := d.reconcileRecords(p, true); err != nil {
		return err
	}
	return d.reconcileDirs(p)
}

// reconcileRecords repairs the records of pool p.
func (d *Engine) reconcileRecords(p *Pool, home bool) error {
	for _, v := range d.Records.Volumes.All() {
		if d.PoolOf(v.Pool) != p {
			continue
		}
		switch v.Phase {
		case PhaseCreating, PhaseDeleting:
			klog.InfoS("repair: finishing interrupted volume operation", "volume_id", v.ID, "name", v.Name, "phase", v.Phase)
			if err := d.removeVolumeData(v); err != nil {
				return err
			}
			if err := d.Records.Volumes.Drop(v.ID); err != nil {
				return err
			}
		case PhaseReady:
			if NodeCreated(v) {
				where, err := d.mountedAt(v)
				if err != nil {
					// Cannot tell: keep it (removing a mounted volume's
					// data is the worse mistake); unpublish clears it.
					klog.InfoS("cannot tell whether an inline or local volume is still mounted; keeping it", "volume_id", v.ID, "name", v.Name, "err", err)
					continue
				}
				if where == "" {
					// An inline volume whose pod is gone (crash or reboot),
					// or a local volume no longer published: clear it.
					klog.InfoS("repair: removing an unpublished inline or local volume", "volume_id", v.ID, "name", v.Name)
					v.Published, v.Staged = nil, nil
					if err := d.releaseNodeCreated(v); err != nil {
						return err
					}
					continue
				}
			}
			// The data's own presence: the pool being reconciled is not
			// up yet, so dataPresent would answer for the pool.
			if v.Fresh && (home || present("volume", v.ID, v.Name, d.VolumeDataPath(v)) == nil) {
				if err := d.repairFresh(v); err != nil {
					return err
				}
				continue
			}
			if err := present("volume", v.ID, v.Name, d.VolumeDataPath(v)); err != nil {
				klog.InfoS("volume data is missing; its record is kept and publish refused until the data is back", "volume_id", v.ID, "name", v.Name, "path", d.VolumeDataPath(v))
			}
		}
	}
	for _, s := range d.Records.Snapshots.All() {
		if d.PoolOf(s.Pool) != p {
			continue
		}
		switch s.Phase {
		case PhaseCreating, PhaseDeleting:
			klog.InfoS("repair: finishing interrupted snapshot operation", "snapshot_id", s.ID, "name", s.Name, "phase", s.Phase)
			if err := d.removeSnapshotData(s); err != nil {
				return err
			}
			if err := d.Records.Snapshots.Drop(s.ID); err != nil {
				return err
			}
		case PhaseReady:
			if err := present("snapshot", s.ID, s.Name, d.SnapshotDataPath(s)); err != nil {
				klog.InfoS("snapshot data is missing; its record is kept and restores refused until the data is back", "snapshot_id", s.ID, "name", s.Name, "path", d.SnapshotDataPath(s))
			}
		}
	}
	for _, g := range d.Records.Groups.All() {
		if g.Phase == PhaseReady || !d.membersReachable(g, p) {
			continue
		}
		klog.InfoS("repair: finishing interrupted group snapshot operation", "group_snapshot_id", g.ID, "phase", g.Phase)
		for _, s := range d.Records.Snapshots.All() {
			if s.Group == g.ID {
				if err := d.removeSnapshotData(s); err != nil {
					return err
				}
				if err := d.Records.Snapshots.Drop(s.ID); err != nil {
					return err
				}
			}
		}
		if err := d.Records.Groups.Drop(g.ID); err != nil {
			return err
		}
	}
	return nil
}

// membersReachable reports whether every snapshot of group g is in pool p
// (being reconciled) or in a pool that is up: an interrupted group is
// undone only when all of it can be.
func (d *Engine) membersReachable(g GroupRecord, p *Pool) bool {
	for _, s := range d.Records.Snapshots.All() {
		if s.Group != g.ID {
			continue
		}
		if sp := d.PoolOf(s.Pool); sp != p && sp.Get().Down != nil {
			return false
		}
	}
	return true
}

// reconcileDirs looks at what pool p's directories hold beside the
// records: data no record owns, and unfinished work in tmp/.
func (d *Engine) reconcileDirs(p *Pool) error {
	if err := d.removeOrphans(p.Paths.Volumes(), func(id string) bool { _, ok := d.Records.Volumes.Get(id); return ok }, ValidVolumeID, true); err != nil {
		return err
	}
	if err := d.removeOrphans(p.Paths.Snapshots(), func(id string) bool { _, ok := d.Records.Snapshots.Get(id); return ok }, ValidSnapshotID, false); err != nil {
		return err
	}
	entries, err := os.ReadDir(p.Paths.Tmp())
	if err != nil {
		return err
	}
	for _, e := range entries {
		if p.Name == DefaultPool && e.Name() == downgradeGuard {
			continue
		}
		path := filepath.Join(p.Paths.Tmp(), e.Name())
		klog.InfoS("repair: removing unfinished temporary data", "path", path)
		if err := d.releaseTemp(path, e); err != nil {
			return err
		}
		if err := fsops.RemoveAll(path); err != nil {
			return err
		}
	}
	return nil
}

// removeOrphans looks at the entries named by a valid id (with any
// extension) that have no record. Every create and delete writes its
// record durably before it touches data, so such data is not a crash's
// leftover: it is kept and reported, never deleted on the strength of a
// missing record. The one exception is a block volume's file that holds no
// written data (an empty block volume's create writes its record beside
// the file): deleting it loses nothing, and its loop device goes first.
// Entries of a damaged record are left alone, and so is anything else in
// the directory: the driver did not make it.
func (d *Engine) removeOrphans(dir string, known func(string) bool, valid func(string) bool, emptyBlockFiles bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, _, _ := strings.Cut(e.Name(), ".")
		p := filepath.Join(dir, e.Name())
		if e.Name() == VolumesMarker {
			continue
		}
		if !valid(id) {
			klog.InfoS("unexpected entry in state dir left alone", "path", p)
			continue
		}
		if known(id) || d.Records.Volumes.IsDamaged(id) || d.Records.Snapshots.IsDamaged(id) {
			continue
		}
		empty := false
		if emptyBlockFiles && e.Type().IsRegular() && strings.HasSuffix(e.Name(), BlockSuffix) {
			// A loop device still bound to it may hold writes in its own
			// cache that the file does not show yet.
			if err := flushAll(p); err != nil {
				return err
			}
			if empty, err = fsops.HoldsNoData(p); err != nil {
				return err
			}
		}
		if !empty {
			klog.ErrorS(nil, "data that no record owns is kept: no crash leaves it, so a record was lost or it was put here by hand; remove it once it is known not to be needed", "path", p)
			d.Unowned.Add(1)
			continue
		}
		klog.InfoS("repair: removing the file of an empty block volume whose create did not finish", "path", p)
		// A crash between the attach and the record may have left the
		// file bound: let it go, or the device keeps its blocks.
		if err := DetachAll(p); err != nil {
			return err
		}
		if err := fsops.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}

// BlockSuffix ends the name of a block volume's backing file.
const BlockSuffix = ".img"

// dataOf lists what the volumes and snapshots directories hold under id
// (nothing for an id the rules do not take: it is no name to look up).
func (d *Engine) dataOf(id string) []string {
	if !ValidVolumeID(id) && !ValidSnapshotID(id) {
		return nil
	}
	var out []string
	for _, p := range d.PoolList() {
		for _, dir := range []string{p.Paths.Volumes(), p.Paths.Snapshots()} {
			found, _ := filepath.Glob(filepath.Join(dir, id+"*"))
			out = append(out, found...)
		}
	}
	return out
}

// VolumesMarker is a file in the volumes directory that says it is the
// directory the records were made in, not an empty mount point whose disk
// has not arrived yet.
const VolumesMarker = ".hostpath-volumes"

// volumesDirIsHome tells whether the volumes directory is the one the
// records' data lives in: only then may start make again the backing file
// of a fresh block volume that a power loss took (in an empty mount point
// it would be attached, and written, in place of the real one). The marker
// is written durably the first time that is evident: no volume records
// yet, or the data of a ready volume present.
func (d *Engine) volumesDirIsHome() (bool, error) {
	marker := filepath.Join(d.Paths.Volumes(), VolumesMarker)
	if _, err := os.Lstat(marker); err == nil {
		return true, nil
	} else if !os.IsNotExist(err) {
		return false, err
	}
	// Evident when this start made the directory, or it is a mount
	// point (its disk is there). An existing empty directory on the
	// state dir's file system may be a mount point whose disk is late.
	home := d.volumesMade
	if !home {
		vdev, _, _, err := fsops.Identity(d.Paths.Volumes())
		if err != nil {
			return false, err
		}
		rdev, _, _, err := fsops.Identity(d.Paths.Root)
		if err != nil {
			return false, err
		}
		home = vdev != rdev
	}
	for _, v := range d.Records.Volumes.All() {
		if d.PoolOf(v.Pool).Name == DefaultPool && v.Phase == PhaseReady && !v.Fresh && v.LocalPath == "" && d.dataPresent(v) == nil {
			home = true
			break
		}
	}
	if !home {
		klog.InfoS("the volumes directory is not known to be the volumes' home (it was there before, is no mount point and holds no volume's data): empty block volumes that a power loss took are not made again until it is", "path", d.Paths.Volumes())
		return false, nil
	}
	return true, fsops.WriteFileAtomic(marker, []byte("the volumes of this hostpath driver's state dir\n"), 0o600)
}
