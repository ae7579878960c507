// Package route is the deployment's controller (--mode=controller) and
// the control endpoint of each node it talks to.
//
// The csi-snapshotter and csi-resizer run once per cluster, beside the
// controller, as upstream ships them: with no flag on the
// snapshot-controller, and one watch of the cluster's claims and contents
// instead of one per node. Their calls (CreateSnapshot, DeleteSnapshot,
// ListSnapshots, GetSnapshot, ControllerExpandVolume,
// ControllerModifyVolume and the GroupController service) name volumes,
// snapshots and groups whose ids carry the key of the node that made them
// (engine.NodeTag); the Controller forwards each to that node's control
// endpoint, and the node's own driver answers it from its own records, as
// it would on its own socket. The channel is the transfer's mutual TLS:
// the controller holds a certificate of its own (transfer.ControllerPeer)
// from the transfer signer, a node's endpoint admits only it and only
// those calls, and the controller talks only to a server whose
// certificate names the node it meant.
//
// A node that cannot be reached (down, or gone) answers Unavailable: the
// sidecars retry with their backoff, and the call goes through when the
// node is back.
package route
