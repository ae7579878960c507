package engine

import "github.com/hostpath-csi/hostpath/engine/store"

// The records live in package store; these names keep the handlers short.
type (
	VolumeRecord   = store.Volume
	SnapshotRecord = store.Snapshot
	GroupRecord    = store.Group
	publication    = store.Publication
)

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
