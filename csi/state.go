package csi

import "github.com/hostpath-csi/hostpath/engine/store"

// The records live in package store; these names keep the handlers short.
type (
	volumeRecord   = store.Volume
	snapshotRecord = store.Snapshot
	groupRecord    = store.Group
	publication    = store.Publication
)

// Phases of a record (see store): written "creating" before any data
// exists and "deleting" before any is removed.
const (
	phaseCreating = store.Creating
	phaseReady    = store.Ready
	phaseDeleting = store.Deleting
)

// Access types of a volume.
const (
	accessMount = "mount"
	accessBlock = "block"
)
