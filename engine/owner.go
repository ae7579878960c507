package engine

import "github.com/hostpath-csi/hostpath/engine/store"

// The metadata the sidecars add to a request's parameters with
// --extra-create-metadata: which Kubernetes objects a volume or snapshot
// is made for. A volume keeps its parameters, these among them; a
// snapshot keeps them as its Owner. They are what a node trusts when
// another node asks for one of its sources (kubepeers.Pending), since no
// other node can write this node's records.
const (
	MetaPVCName         = CoParamPrefix + "pvc/name"
	MetaPVCNamespace    = CoParamPrefix + "pvc/namespace"
	MetaPVName          = CoParamPrefix + "pv/name"
	MetaSnapshotName    = CoParamPrefix + "volumesnapshot/name"
	MetaSnapshotNS      = CoParamPrefix + "volumesnapshot/namespace"
	MetaSnapshotContent = CoParamPrefix + "volumesnapshotcontent/name"
	MetaGroupName       = CoParamPrefix + "volumegroupsnapshot/name"
	MetaGroupNS         = CoParamPrefix + "volumegroupsnapshot/namespace"
	MetaGroupContent    = CoParamPrefix + "volumegroupsnapshotcontent/name"
)

// Owner is the Kubernetes object a source was made for: for a snapshot
// the VolumeSnapshot (namespace, name) and its content; for a volume the
// claim (namespace, name) and its PersistentVolume (Content).
type Owner = store.Owner

// snapshotOwner is the owner a CreateSnapshot's parameters name, or, for
// a member of a group (group set), the VolumeGroupSnapshot and content a
// CreateVolumeGroupSnapshot's name; nil when they do not name all three.
func snapshotOwner(params map[string]string, group string) *Owner {
	o := Owner{Namespace: params[MetaSnapshotNS], Name: params[MetaSnapshotName], Content: params[MetaSnapshotContent]}
	if group != "" {
		o = Owner{Namespace: params[MetaGroupNS], Name: params[MetaGroupName], Content: params[MetaGroupContent], Group: true}
	}
	if o.Namespace == "" || o.Name == "" || o.Content == "" {
		return nil
	}
	return &o
}

// SnapshotSourceVolume is the volume snapshot id was made of ("" for
// none here).
func (d *Engine) SnapshotSourceVolume(id string) string {
	s, _ := d.Records.Snapshots.Get(id)
	return s.SourceVolume
}

// SourceOwner is what this node recorded about the source of kind
// (SourceSnapshot or SourceVolume) and id when it made it: whether it is
// here and ready, and the object it was made for (ok false when the
// request that made it named none).
func (d *Engine) SourceOwner(kind, id string) (owner Owner, here, ok bool) {
	switch kind {
	case SourceSnapshot:
		s, found := d.Records.Snapshots.Get(id)
		if !found || s.Phase != PhaseReady {
			return Owner{}, false, false
		}
		if s.Owner == nil {
			return Owner{}, true, false
		}
		return *s.Owner, true, true
	case SourceVolume:
		v, found := d.Records.Volumes.Get(id)
		if !found || v.Phase != PhaseReady {
			return Owner{}, false, false
		}
		o := Owner{Namespace: v.Parameters[MetaPVCNamespace], Name: v.Parameters[MetaPVCName], Content: v.Parameters[MetaPVName]}
		return o, true, o.Namespace != "" && o.Name != "" && o.Content != ""
	}
	return Owner{}, false, false
}
