// Package kubepeers finds what the node-to-node transfer (package transfer)
// needs in the Kubernetes API, and nothing else: the Secret in the driver's
// namespace that holds the deployment's transfer authority; the node a
// key names, through the CSINode objects (whose names are their kubelets'
// own) and the Node objects (which give its internal address); and which
// node may have which source, through the claims pending on each node and
// their data sources (Pending, the server's Authorizer). It needs get,
// create and update of that one Secret and read access to CSINodes, Nodes,
// claims, volumes, VolumeSnapshots and their contents, which the node's
// sidecars need already.
//
// It knows nothing of CSI beyond a driver name, and is handed how a key is
// made from a node id and the transfer's names of its kinds of source.
package kubepeers
