package csi

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
func (d *engine) reconcile() error {
	home, err := d.volumesDirIsHome()
	if err != nil {
		return err
	}
	for _, note := range d.st.Notes() {
		klog.ErrorS(nil, "repair: "+note)
	}
	for _, bad := range d.st.Damaged() {
		klog.ErrorS(nil, "a state record is damaged; its data is kept and its id refused until the record is repaired: restore the file from a backup (the data is at the path named), or move the file and the data away to give up the volume or snapshot",
			"id", bad.ID, "record", bad.Path, "problem", bad.Problem, "data", d.dataOf(bad.ID))
	}
	def := d.pools[DefaultPool]
	if err := d.reconcileRecords(def, home); err != nil {
		return err
	}
	return d.reconcileDirs(def)
}

// reconcilePool is reconcile for a pool other than the default as it comes
// up: its marker proves its volumes directory is the volumes' home.
func (d *engine) reconcilePool(p *pool) error {
	if err := d.reconcileRecords(p, true); err != nil {
		return err
	}
	return d.reconcileDirs(p)
}

// reconcileRecords repairs the records of pool p.
func (d *engine) reconcileRecords(p *pool, home bool) error {
	for _, v := range d.st.Volumes.All() {
		if d.poolOf(v.Pool) != p {
			continue
		}
		switch v.Phase {
		case phaseCreating, phaseDeleting:
			klog.InfoS("repair: finishing interrupted volume operation", "volume_id", v.ID, "name", v.Name, "phase", v.Phase)
			if err := d.removeVolumeData(v); err != nil {
				return err
			}
			if err := d.st.Volumes.Drop(v.ID); err != nil {
				return err
			}
		case phaseReady:
			if nodeCreated(v) {
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
			if v.Fresh && (home || present("volume", v.ID, v.Name, d.volumeDataPath(v)) == nil) {
				if err := d.repairFresh(v); err != nil {
					return err
				}
				continue
			}
			if err := present("volume", v.ID, v.Name, d.volumeDataPath(v)); err != nil {
				klog.InfoS("volume data is missing; its record is kept and publish refused until the data is back", "volume_id", v.ID, "name", v.Name, "path", d.volumeDataPath(v))
			}
		}
	}
	for _, s := range d.st.Snapshots.All() {
		if d.poolOf(s.Pool) != p {
			continue
		}
		switch s.Phase {
		case phaseCreating, phaseDeleting:
			klog.InfoS("repair: finishing interrupted snapshot operation", "snapshot_id", s.ID, "name", s.Name, "phase", s.Phase)
			if err := d.removeSnapshotData(s); err != nil {
				return err
			}
			if err := d.st.Snapshots.Drop(s.ID); err != nil {
				return err
			}
		case phaseReady:
			if err := present("snapshot", s.ID, s.Name, d.snapshotDataPath(s)); err != nil {
				klog.InfoS("snapshot data is missing; its record is kept and restores refused until the data is back", "snapshot_id", s.ID, "name", s.Name, "path", d.snapshotDataPath(s))
			}
		}
	}
	for _, g := range d.st.Groups.All() {
		if g.Phase == phaseReady || !d.membersReachable(g, p) {
			continue
		}
		klog.InfoS("repair: finishing interrupted group snapshot operation", "group_snapshot_id", g.ID, "phase", g.Phase)
		for _, s := range d.st.Snapshots.All() {
			if s.Group == g.ID {
				if err := d.removeSnapshotData(s); err != nil {
					return err
				}
				if err := d.st.Snapshots.Drop(s.ID); err != nil {
					return err
				}
			}
		}
		if err := d.st.Groups.Drop(g.ID); err != nil {
			return err
		}
	}
	return nil
}

// membersReachable reports whether every snapshot of group g is in pool p
// (being reconciled) or in a pool that is up: an interrupted group is
// undone only when all of it can be.
func (d *engine) membersReachable(g groupRecord, p *pool) bool {
	for _, s := range d.st.Snapshots.All() {
		if s.Group != g.ID {
			continue
		}
		if sp := d.poolOf(s.Pool); sp != p && sp.get().down != nil {
			return false
		}
	}
	return true
}

// reconcileDirs looks at what pool p's directories hold beside the
// records: data no record owns, and unfinished work in tmp/.
func (d *engine) reconcileDirs(p *pool) error {
	if err := d.removeOrphans(p.paths.volumes(), func(id string) bool { _, ok := d.st.Volumes.Get(id); return ok }, validVolumeID, true); err != nil {
		return err
	}
	if err := d.removeOrphans(p.paths.snapshots(), func(id string) bool { _, ok := d.st.Snapshots.Get(id); return ok }, validSnapshotID, false); err != nil {
		return err
	}
	entries, err := os.ReadDir(p.paths.tmp())
	if err != nil {
		return err
	}
	for _, e := range entries {
		if p.name == DefaultPool && e.Name() == downgradeGuard {
			continue
		}
		path := filepath.Join(p.paths.tmp(), e.Name())
		klog.InfoS("repair: removing unfinished temporary data", "path", path)
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
func (d *engine) removeOrphans(dir string, known func(string) bool, valid func(string) bool, emptyBlockFiles bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, _, _ := strings.Cut(e.Name(), ".")
		p := filepath.Join(dir, e.Name())
		if e.Name() == volumesMarker {
			continue
		}
		if !valid(id) {
			klog.InfoS("unexpected entry in state dir left alone", "path", p)
			continue
		}
		if known(id) || d.st.Volumes.IsDamaged(id) || d.st.Snapshots.IsDamaged(id) {
			continue
		}
		empty := false
		if emptyBlockFiles && e.Type().IsRegular() && strings.HasSuffix(e.Name(), blockSuffix) {
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
			d.unowned.Add(1)
			continue
		}
		klog.InfoS("repair: removing the file of an empty block volume whose create did not finish", "path", p)
		// A crash between the attach and the record may have left the
		// file bound: let it go, or the device keeps its blocks.
		if err := detachAll(p); err != nil {
			return err
		}
		if err := fsops.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}

// blockSuffix ends the name of a block volume's backing file.
const blockSuffix = ".img"

// dataOf lists what the volumes and snapshots directories hold under id
// (nothing for an id the rules do not take: it is no name to look up).
func (d *engine) dataOf(id string) []string {
	if !validVolumeID(id) && !validSnapshotID(id) {
		return nil
	}
	var out []string
	for _, p := range d.poolList() {
		for _, dir := range []string{p.paths.volumes(), p.paths.snapshots()} {
			found, _ := filepath.Glob(filepath.Join(dir, id+"*"))
			out = append(out, found...)
		}
	}
	return out
}

// volumesMarker is a file in the volumes directory that says it is the
// directory the records were made in, not an empty mount point whose disk
// has not arrived yet.
const volumesMarker = ".hostpath-volumes"

// volumesDirIsHome tells whether the volumes directory is the one the
// records' data lives in: only then may start make again the backing file
// of a fresh block volume that a power loss took (in an empty mount point
// it would be attached, and written, in place of the real one). The marker
// is written durably the first time that is evident: no volume records
// yet, or the data of a ready volume present.
func (d *engine) volumesDirIsHome() (bool, error) {
	marker := filepath.Join(d.paths.volumes(), volumesMarker)
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
		vdev, _, _, err := fsops.Identity(d.paths.volumes())
		if err != nil {
			return false, err
		}
		rdev, _, _, err := fsops.Identity(d.paths.root)
		if err != nil {
			return false, err
		}
		home = vdev != rdev
	}
	for _, v := range d.st.Volumes.All() {
		if d.poolOf(v.Pool).name == DefaultPool && v.Phase == phaseReady && !v.Fresh && v.LocalPath == "" && d.dataPresent(v) == nil {
			home = true
			break
		}
	}
	if !home {
		klog.InfoS("the volumes directory is not known to be the volumes' home (it was there before, is no mount point and holds no volume's data): empty block volumes that a power loss took are not made again until it is", "path", d.paths.volumes())
		return false, nil
	}
	return true, fsops.WriteFileAtomic(marker, []byte("the volumes of this hostpath driver's state dir\n"), 0o600)
}
