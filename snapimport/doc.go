// Package snapimport makes imported snapshots usable where snapshotters
// run on every node. A VolumeSnapshotContent written by a user with a
// snapshotHandle (a pre-provisioned, "imported" snapshot) carries no
// snapshot.storage.kubernetes.io/managed-by label, and a csi-snapshotter
// deployed per node (--node-deployment) watches only the contents labelled
// with its node's name, so none would ever make it ready. Each node runs a
// Labeler that gives the label, naming itself, to the unlabelled contents
// of its driver whose snapshot it holds.
//
// It knows nothing of CSI beyond a driver name and a question it is handed
// (does this node hold the snapshot with this handle?); it reaches the
// Kubernetes API through the snapshot client library.
package snapimport
