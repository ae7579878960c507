package kubepeers

import (
	"context"
	"fmt"
	"net"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hostpath-csi/hostpath/transfer"
)

// SecretStore keeps the transfer authority in one Secret (a transfer.Store).
// Its resource version is the store's version, so a create or a rollover
// that races another node's is a conflict, and the loser uses the winner's.
type SecretStore struct {
	Client          kubernetes.Interface
	Namespace, Name string
	// Owner, when set, owns the Secret (the drivers' DaemonSet): deleting
	// the deployment (kubectl delete -k, helm uninstall) deletes it too.
	Owner *metav1.OwnerReference
}

// Load implements transfer.Store.
func (s *SecretStore) Load(ctx context.Context) (map[string][]byte, string, error) {
	sec, err := s.Client.CoreV1().Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
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
		_, err = s.Client.CoreV1().Secrets(s.Namespace).Create(ctx, sec, metav1.CreateOptions{})
	} else {
		_, err = s.Client.CoreV1().Secrets(s.Namespace).Update(ctx, sec, metav1.UpdateOptions{})
	}
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		return fmt.Errorf("%w: %v", transfer.ErrConflict, err)
	}
	return err
}

// ControllerOf is the controller (the DaemonSet) of pod name in
// namespace, as an owner for what the drivers make; nil when it has none.
func ControllerOf(ctx context.Context, client kubernetes.Interface, namespace, name string) (*metav1.OwnerReference, error) {
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
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

// Resolver finds the node whose driver id has a given key, and its
// transfer address: the Node's internal IP and Port.
type Resolver struct {
	Client kubernetes.Interface
	Driver string
	Port   int
	// KeyOf makes the key of a node's driver id (for the CSI driver, the
	// node tag its ids carry).
	KeyOf func(nodeID string) string
}

// Resolve implements transfer.Peers' Resolve. A node that is gone (its
// CSINode deleted with it) or has no internal address is an error.
func (r *Resolver) Resolve(ctx context.Context, key string) (string, string, error) {
	list, err := r.Client.StorageV1().CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", "", fmt.Errorf("listing CSINodes: %w", err)
	}
	for _, cn := range list.Items {
		for _, d := range cn.Spec.Drivers {
			if d.Name != r.Driver || r.KeyOf(d.NodeID) != key {
				continue
			}
			node, err := r.Client.CoreV1().Nodes().Get(ctx, cn.Name, metav1.GetOptions{})
			if err != nil {
				return "", cn.Name, fmt.Errorf("node %s: %w", cn.Name, err)
			}
			for _, a := range node.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					return net.JoinHostPort(a.Address, strconv.Itoa(r.Port)), cn.Name, nil
				}
			}
			return "", cn.Name, fmt.Errorf("node %s has no internal IP", cn.Name)
		}
	}
	return "", "", fmt.Errorf("no node of the cluster runs driver %s with key %s (the node may be gone)", r.Driver, key)
}
