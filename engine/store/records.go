package store

import (
	"maps"
	"slices"
	"time"
)

// Phases of a record. A record is written Creating before any data exists
// and Deleting before any data is removed, so that after a crash startup
// knows which half-made or half-removed things to clear away.
const (
	Creating = "creating"
	Ready    = "ready"
	Deleting = "deleting"
)

// Publication is one NodePublishVolume target of a volume on this node.
type Publication struct {
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	// SingleWriter is set for SINGLE_NODE_SINGLE_WRITER, which allows only
	// one target at a time.
	SingleWriter bool `json:"singleWriter,omitempty"`
}

// Volume is what the driver keeps about one volume.
type Volume struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	CapacityBytes  int64             `json:"capacityBytes"`
	AccessType     string            `json:"accessType"`
	Phase          string            `json:"phase"`
	Kind           string            `json:"kind,omitempty"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	SourceSnapshot string            `json:"sourceSnapshot,omitempty"`
	SourceVolume   string            `json:"sourceVolume,omitempty"`
	CreatedAt      time.Time         `json:"createdAt"`
	Staged         []string          `json:"staged,omitempty"`
	Published      []Publication     `json:"published,omitempty"`
	AttachedNodes  []string          `json:"attachedNodes,omitempty"`
	// ProjectID is the volume's project quota id, where project quotas
	// limit directory volumes.
	ProjectID uint32 `json:"projectId,omitempty"`
	// Mutable are the VolumeAttributesClass parameters in force.
	Mutable map[string]string `json:"mutable,omitempty"`
	// LocalPath is the node directory a static local volume shows.
	LocalPath string `json:"localPath,omitempty"`
	// Fresh marks an empty block volume whose backing file has not been
	// made durable yet, which no pod has written to: the first stage or
	// publish fsyncs it, and a start that finds it missing or short (a
	// power loss) makes it again.
	Fresh bool `json:"fresh,omitempty"`
	// Pool is the storage pool the volume's data is in; empty for the
	// state dir's own (every record from before pools).
	Pool string `json:"pool,omitempty"`
	// Layout is how a mount volume's data is kept: empty for a directory
	// in its pool (every record from before layouts), "image" for an
	// image file holding a file system of its own on a loop device.
	Layout string `json:"layout,omitempty"`
	// FSType is the file system an image volume was made to hold when it
	// was made empty (or filled from a tree): empty for ext4 (every record
	// from before XFS), "xfs". A copy holds what its source's image holds.
	FSType string `json:"fsType,omitempty"`
	// Standby is the node that keeps a copy of this image or block volume
	// by changed blocks (docs/standby.md), the only node it is sent to;
	// empty for none.
	Standby string `json:"standby,omitempty"`
	// Epoch is the volume's fencing epoch: 0 where it was made, one more
	// at each promotion of its standby copy, so that of two nodes that
	// each hold the volume the higher epoch is its owner.
	Epoch uint64 `json:"epoch,omitempty"`
	// HandedTo is the node this volume was handed over to (a move to its
	// standby's node): from then on this node never stages it, and it
	// becomes the volume's standby once that node says it holds it.
	HandedTo string `json:"handedTo,omitempty"`
}

// Standby is what the driver keeps about a copy it holds of another
// node's volume: the volume it stands by for, and the node that is its
// primary, the only node it pulls it from. Its id is the volume's.
type Standby struct {
	Volume  string `json:"volume"`
	Primary string `json:"primary"`
	Phase   string `json:"phase"`
	// Pool is the pool its generations are in; empty for the state dir's.
	Pool       string    `json:"pool,omitempty"`
	AccessType string    `json:"accessType"`
	Layout     string    `json:"layout,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	// IntervalSeconds is how often it catches up (its class's
	// standbyInterval).
	IntervalSeconds int `json:"intervalSeconds,omitempty"`
	// PV is the PersistentVolume of the volume, by which this node learned
	// of it and learns that it is gone.
	PV string `json:"pv,omitempty"`
	// Epoch is the fencing epoch of the primary it copies; a promotion
	// makes the volume here with the next.
	Epoch uint64 `json:"epoch,omitempty"`
}

// Snapshot is what the driver keeps about one snapshot.
type Snapshot struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	SourceVolume string    `json:"sourceVolume"`
	AccessType   string    `json:"accessType"`
	Phase        string    `json:"phase"`
	CreatedAt    time.Time `json:"createdAt"`
	// SizeBytes is what the snapshot really occupies.
	SizeBytes int64 `json:"sizeBytes"`
	// VolumeBytes is the size of the volume it was taken from, the least a
	// volume restored from it may have.
	VolumeBytes int64  `json:"volumeBytes"`
	SHA256      string `json:"sha256,omitempty"`
	// DataSum is an image snapshot's (FormatImage) checksum at rest:
	// fsops.DataSum of its file, its data ranges and their offsets (holes
	// cost nothing). Empty for snapshots from before it.
	DataSum string `json:"dataSum,omitempty"`
	Format  string `json:"format,omitempty"`
	// Group is the group snapshot this snapshot belongs to, if any.
	Group string `json:"group,omitempty"`
	// Pool is the storage pool the snapshot's data is in; empty for the
	// state dir's own.
	Pool string `json:"pool,omitempty"`
	// Owner is the VolumeSnapshot the snapshot was made for; nil for
	// snapshots asked for without the snapshotter's metadata (the CSI API
	// alone, group members, records from before owners).
	Owner *Owner `json:"owner,omitempty"`
}

// Owner is the Kubernetes object a snapshot was made for, as the
// snapshotter passed it (--extra-create-metadata): the VolumeSnapshot's
// namespace and name and the VolumeSnapshotContent's name. The node that
// holds the snapshot serves it to another node only for a restore from
// that VolumeSnapshot bound to that content: its own record, not an API
// object another node could have written, says which.
type Owner struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Content   string `json:"content"`
	// Group says the owner is a VolumeGroupSnapshot (Name) and its
	// content: the snapshot is one member of it.
	Group bool `json:"group,omitempty"`
}

// Group is a VolumeGroupSnapshot: a set of snapshots made together.
type Group struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Phase     string    `json:"phase"`
	CreatedAt time.Time `json:"createdAt"`
	// Volumes and Snapshots are parallel: Snapshots[i] is of Volumes[i].
	Volumes   []string `json:"volumes"`
	Snapshots []string `json:"snapshots"`
}

// Record is what a Table holds: a value with an id and a name that copies
// itself deeply, so no caller shares a slice or map with the index.
type Record[T any] interface {
	RecordID() string
	RecordName() string
	Clone() T
}

// RecordID is the volume's id (RecordID, RecordName and Clone make Volume
// a Record).
func (v Volume) RecordID() string { return v.ID }

// RecordName is the volume's name.
func (v Volume) RecordName() string { return v.Name }

// Clone is a copy of the volume that shares no slice or map with it.
func (v Volume) Clone() Volume {
	v.Parameters = maps.Clone(v.Parameters)
	v.Mutable = maps.Clone(v.Mutable)
	v.Staged = slices.Clone(v.Staged)
	v.Published = slices.Clone(v.Published)
	v.AttachedNodes = slices.Clone(v.AttachedNodes)
	return v
}

// RecordID is the snapshot's id (RecordID, RecordName and Clone make
// Snapshot a Record).
func (s Snapshot) RecordID() string { return s.ID }

// RecordName is the snapshot's name.
func (s Snapshot) RecordName() string { return s.Name }

// Clone is a copy of the snapshot that shares nothing with it.
func (s Snapshot) Clone() Snapshot {
	if s.Owner != nil {
		o := *s.Owner
		s.Owner = &o
	}
	return s
}

// RecordID is the volume a standby copy is of (RecordID, RecordName and
// Clone make Standby a Record).
func (s Standby) RecordID() string { return s.Volume }

// RecordName is the volume too: a standby copy is found by its volume.
func (s Standby) RecordName() string { return s.Volume }

// Clone is a copy of the record (it holds no slice or map).
func (s Standby) Clone() Standby { return s }

// RecordID is the group's id (RecordID, RecordName and Clone make Group
// a Record).
func (g Group) RecordID() string { return g.ID }

// RecordName is the group's name.
func (g Group) RecordName() string { return g.Name }

// Clone is a copy of the group that shares no slice with it.
func (g Group) Clone() Group {
	g.Volumes = slices.Clone(g.Volumes)
	g.Snapshots = slices.Clone(g.Snapshots)
	return g
}
