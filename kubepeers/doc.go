// Package kubepeers finds what the node-to-node transfer (package transfer)
// needs in the Kubernetes API, and nothing else:
//
//   - the transfer signer (Signer): it approves and signs the nodes'
//     certificate requests for its signer name, each only for the node,
//     pod and service account the API server records for the requester's
//     token, keeps its key in a Secret of its own (SecretStore), and
//     publishes the authorities to trust in a ConfigMap; it grants the
//     controller's identity (transfer.ControllerPeer) only to the pods of
//     the controller's service account that a ReplicaSet owns
//     (ControllerServiceAccount);
//   - a node's side of it (CSRAuthority): its key stays in its process,
//     its request goes through the CSR API;
//   - the node an id's tag names, through the CSINode objects (whose names
//     are their kubelets' own) and the Node objects (Resolver);
//   - which node may have which source (Pending, the server's
//     Authorizer): a claim pending on the asking node for the object the
//     serving node's own record says the source was made for, with a
//     ReferenceGrant (Grants) for a source in another namespace.
//
// It knows nothing of CSI beyond a driver name, and is handed how a key is
// made from a node id, the serving node's records, and the transfer's
// names of its kinds of source.
package kubepeers
