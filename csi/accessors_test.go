package csi

import "github.com/hostpath-csi/hostpath/engine"

// What the tests read of a driver's state, through small accessors rather
// than its fields, so that when the storage side moves into a package of
// its own only these lines change.

// stateRoot is the driver's state dir (the default pool's root).
func stateRoot(d *Driver) string { return d.eng.Paths.Root }

// volumesDir is where the default pool keeps volumes' data.
func volumesDir(d *Driver) string { return d.eng.Paths.Volumes() }

// volumeDir is volume id's directory (or block file's directory) in the
// default pool.
func volumeDir(d *Driver, id string) string { return d.eng.Paths.VolumeDir(id) }

// snapshotsDir is where the default pool keeps snapshots.
func snapshotsDir(d *Driver) string { return d.eng.Paths.Snapshots() }

// tmpDir is the state dir's scratch directory.
func tmpDir(d *Driver) string { return d.eng.Paths.Tmp() }

// metaDir holds the records, the journal and the format file.
func metaDir(d *Driver) string { return d.eng.Paths.Meta() }

// volumeRec is volume id's record.
func volumeRec(d *Driver, id string) (engine.VolumeRecord, bool) {
	return d.eng.Records.Volumes.Get(id)
}

// volumeNamed is the record of the volume of that name.
func volumeNamed(d *Driver, name string) (engine.VolumeRecord, bool) {
	return d.eng.Records.Volumes.ByName(name)
}

// allVolumes are every volume record.
func allVolumes(d *Driver) []engine.VolumeRecord { return d.eng.Records.Volumes.All() }

// snapshotRec is snapshot id's record.
func snapshotRec(d *Driver, id string) (engine.SnapshotRecord, bool) {
	return d.eng.Records.Snapshots.Get(id)
}

// snapshotNamed is the record of the snapshot of that name.
func snapshotNamed(d *Driver, name string) (engine.SnapshotRecord, bool) {
	return d.eng.Records.Snapshots.ByName(name)
}

// allSnapshots are every snapshot record.
func allSnapshots(d *Driver) []engine.SnapshotRecord { return d.eng.Records.Snapshots.All() }

// allGroups are every group snapshot record.
func allGroups(d *Driver) []engine.GroupRecord { return d.eng.Records.Groups.All() }

// poolNow is pool name's state now.
func poolNow(d *Driver, name string) *engine.PoolState { return d.eng.Pools[name].Get() }
