package csi

// What the tests read of a driver's state, through small accessors rather
// than its fields, so that when the storage side moves into a package of
// its own only these lines change.

// stateRoot is the driver's state dir (the default pool's root).
func stateRoot(d *Driver) string { return d.paths.root }

// volumesDir is where the default pool keeps volumes' data.
func volumesDir(d *Driver) string { return d.paths.volumes() }

// volumeDir is volume id's directory (or block file's directory) in the
// default pool.
func volumeDir(d *Driver, id string) string { return d.paths.volumeDir(id) }

// snapshotsDir is where the default pool keeps snapshots.
func snapshotsDir(d *Driver) string { return d.paths.snapshots() }

// tmpDir is the state dir's scratch directory.
func tmpDir(d *Driver) string { return d.paths.tmp() }

// metaDir holds the records, the journal and the format file.
func metaDir(d *Driver) string { return d.paths.meta() }

// volumeRec is volume id's record.
func volumeRec(d *Driver, id string) (volumeRecord, bool) { return d.st.Volumes.Get(id) }

// volumeNamed is the record of the volume of that name.
func volumeNamed(d *Driver, name string) (volumeRecord, bool) { return d.st.Volumes.ByName(name) }

// allVolumes are every volume record.
func allVolumes(d *Driver) []volumeRecord { return d.st.Volumes.All() }

// snapshotRec is snapshot id's record.
func snapshotRec(d *Driver, id string) (snapshotRecord, bool) { return d.st.Snapshots.Get(id) }

// snapshotNamed is the record of the snapshot of that name.
func snapshotNamed(d *Driver, name string) (snapshotRecord, bool) {
	return d.st.Snapshots.ByName(name)
}

// allSnapshots are every snapshot record.
func allSnapshots(d *Driver) []snapshotRecord { return d.st.Snapshots.All() }

// allGroups are every group snapshot record.
func allGroups(d *Driver) []groupRecord { return d.st.Groups.All() }

// poolNow is pool name's state now.
func poolNow(d *Driver, name string) *poolState { return d.pools[name].get() }
