package kubepeers

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/kube"
	"github.com/hostpath-csi/hostpath/transfer"
)

// SecretStore keeps the transfer authority in one Secret (a transfer.Store).
// Its resource version is the store's version, so a create or a rollover
// that races another node's is a conflict, and the loser uses the winner's.
type SecretStore struct {
	Client          kube.Interface
	Namespace, Name string
	// Owner, when set, owns the Secret (the drivers' DaemonSet): deleting
	// the deployment (kubectl delete -k, helm uninstall) deletes it too.
	Owner *metav1.OwnerReference
}

// Load implements transfer.Store.
func (s *SecretStore) Load(ctx context.Context) (map[string][]byte, string, error) {
	sec, err := s.Client.Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, "", transfer.ErrNoAuthority
	}
	if err != nil {
		return nil, "", err
	}
	return sec.Data, sec.ResourceVersion, nil
}

// Save implements transfer.Store.
func (s *SecretStore) Save(ctx context.Context, data map[string][]byte, version string) error {
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, ResourceVersion: version,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "hostpath-csi"},
			Annotations: map[string]string{
				"hostpath.csi/what": "the authority the driver's nodes authenticate each other with; made and rolled over by the drivers; delete it to replace it",
			},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	if s.Owner != nil {
		sec.OwnerReferences = []metav1.OwnerReference{*s.Owner}
	}
	var err error
	if version == "" {
		_, err = s.Client.Secrets(s.Namespace).Create(ctx, sec, metav1.CreateOptions{})
	} else {
		_, err = s.Client.Secrets(s.Namespace).Update(ctx, sec, metav1.UpdateOptions{})
	}
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		return fmt.Errorf("%w: %v", transfer.ErrConflict, err)
	}
	return err
}

// ControllerOf is the controller (the DaemonSet) of pod name in
// namespace, as an owner for what the drivers make; nil when it has none.
func ControllerOf(ctx context.Context, client kube.Interface, namespace, name string) (*metav1.OwnerReference, error) {
	pod, err := client.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return nil, nil
	}
	owner := *ref
	// Deleting the Secret must not wait for the DaemonSet, nor block it.
	owner.BlockOwnerDeletion = nil
	return &owner, nil
}

// DeploymentOf is the Deployment that runs pod name in namespace (through
// its ReplicaSet), as an owner for what the transfer signer makes; nil
// when there is none.
func DeploymentOf(ctx context.Context, client kube.Interface, namespace, name string) (*metav1.OwnerReference, error) {
	rs, err := ControllerOf(ctx, client, namespace, name)
	if err != nil || rs == nil || rs.Kind != "ReplicaSet" {
		return nil, err
	}
	set, err := client.ReplicaSets(namespace).Get(ctx, rs.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	ref := metav1.GetControllerOf(set)
	if ref == nil || ref.Kind != "Deployment" {
		return nil, nil
	}
	owner := *ref
	owner.BlockOwnerDeletion = nil
	return &owner, nil
}

// CSIDriverOwner is the driver's CSIDriver object as an owner (of the
// cluster-scoped objects a node makes); nil when there is none.
func CSIDriverOwner(ctx context.Context, client kube.Interface, driver string) (*metav1.OwnerReference, error) {
	d, err := client.CSIDrivers().Get(ctx, driver, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &metav1.OwnerReference{APIVersion: "storage.k8s.io/v1", Kind: "CSIDriver", Name: d.Name, UID: d.UID}, nil
}

// Resolver finds the node whose driver id has a given key, and its
// transfer address: the Node's internal IP and Port.
type Resolver struct {
	Client kube.Interface
	Driver string
	Port   int
	// KeyOf makes the key of a node's driver id (for the CSI driver, the
	// node tag its ids carry).
	KeyOf func(nodeID string) string
}

// Keys are the keys of every node that runs the driver, as Resolve trusts
// them (a CSINode whose driver id is its own name).
func (r *Resolver) Keys(ctx context.Context) ([]string, error) {
	nodes, err := r.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(nodes))
	for i, n := range nodes {
		keys[i] = r.KeyOf(n)
	}
	return keys, nil
}

// Nodes are the names of every node that runs the driver, as Resolve
// trusts them (a CSINode whose driver id is its own name).
func (r *Resolver) Nodes(ctx context.Context) ([]string, error) {
	list, err := r.Client.CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing CSINodes: %w", err)
	}
	var nodes []string
	for _, cn := range list.Items {
		for _, d := range cn.Spec.Drivers {
			if d.Name == r.Driver && d.NodeID == cn.Name {
				nodes = append(nodes, cn.Name)
			}
		}
	}
	return nodes, nil
}

// Resolve implements transfer.Peers' Resolve. A node that is gone (its
// CSINode deleted with it) or has no internal address is an error.
//
// The node a key names is the one whose name has that key. A CSINode's
// name is its kubelet's own (the API server's node authorizer lets a
// kubelet write only its own node's objects), while the driver id listed
// in it is whatever the driver on that node says: a node that is taken
// can claim another node's id, never its name. So a CSINode whose driver
// id is not its name is passed over, and the client then checks that the
// server's certificate names that node.
func (r *Resolver) Resolve(ctx context.Context, key string) (string, string, error) {
	list, err := r.Client.CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", fmt.Errorf("listing CSINodes: %w", err)
	}
	var found []string
	var impostors []string
	for _, cn := range list.Items {
		for _, d := range cn.Spec.Drivers {
			if d.Name != r.Driver || r.KeyOf(d.NodeID) != key {
				continue
			}
			if d.NodeID != cn.Name || r.KeyOf(cn.Name) != key {
				impostors = append(impostors, cn.Name)
				continue
			}
			found = append(found, cn.Name)
		}
	}
	switch {
	case len(found) > 1:
		return "", "", fmt.Errorf("nodes %v all have key %s: the source's node cannot be told apart", found, key)
	case len(found) == 0 && len(impostors) > 0:
		return "", "", fmt.Errorf("no node of the cluster runs driver %s with key %s; nodes %v claim it with a driver id that is not their name, and are not trusted", r.Driver, key, impostors)
	case len(found) == 0:
		return "", "", fmt.Errorf("no node of the cluster runs driver %s with key %s (the node may be gone)", r.Driver, key)
	}
	name := found[0]
	node, err := r.Client.Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", name, fmt.Errorf("node %s: %w", name, err)
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return net.JoinHostPort(a.Address, strconv.Itoa(r.Port)), name, nil
		}
	}
	return "", name, fmt.Errorf("node %s has no internal IP", name)
}
