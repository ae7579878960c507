// Package kubepeers finds what the node-to-node transfer (package transfer)
// needs in the Kubernetes API, and nothing else: the Secret in the driver's
// namespace that holds the deployment's transfer authority, and the node a
// key names, through the CSINode objects (which list each node's driver id)
// and the Node objects (which give its internal address). It needs get,
// create and update of that one Secret and read access to CSINodes and
// Nodes, which the node's sidecars need already.
//
// It knows nothing of CSI beyond a driver name, and is handed how a key is
// made from a node id.
package kubepeers
