package engine

import "github.com/hostpath-csi/hostpath/engine/store"

// VolumeRecord is a volume's record in package store, named here so that
// the engine's callers need not import it; so are the two below.
type VolumeRecord = store.Volume

// SnapshotRecord is a snapshot's record.
type SnapshotRecord = store.Snapshot

// GroupRecord is a group snapshot's record.
type GroupRecord = store.Group

type publication = store.Publication

// Phases of a record (see store): written "creating" before any data
// exists and "deleting" before any is removed.
const (
	PhaseCreating = store.Creating
	PhaseReady    = store.Ready
	PhaseDeleting = store.Deleting
)

// Access types of a volume.
const (
	AccessMount = "mount"
	AccessBlock = "block"
)
