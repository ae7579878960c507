package kubestandby

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/kube"
)

// OutOfService is the taint an administrator puts on a node that is shut
// down and will not come back on its own (Kubernetes' non-graceful node
// shutdown): its pods are deleted at once and their volumes detached.
const OutOfService = "node.kubernetes.io/out-of-service"

// Fences says a node is fenced when its Node carries the out-of-service
// taint or is deleted: the two ways Kubernetes lets an administrator say a
// node no longer runs anything. A node that is merely NotReady or
// unreachable is not fenced: it may still be writing.
func Fences(client kube.Interface) engine.Fences {
	return func(ctx context.Context, node string) (string, error) {
		n, err := client.Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("node %s's Node object is deleted", node), nil
		}
		if err != nil {
			return "", err
		}
		return fenceOf(n), nil
	}
}

// fenceOf is how Node n is fenced, "" when it is not.
func fenceOf(n *corev1.Node) string {
	for _, t := range n.Spec.Taints {
		if t.Key == OutOfService && (t.Effect == corev1.TaintEffectNoExecute || t.Effect == corev1.TaintEffectNoSchedule) {
			return fmt.Sprintf("node %s carries the %s taint (%s=%s:%s)", n.Name, OutOfService, t.Key, t.Value, t.Effect)
		}
	}
	return ""
}

// Holders is the routing controller's way to a volume that moved (route's
// Controller.Holders): the node keys of the nodes its PV names, its
// primary and its standby, which are the only nodes that may hold it. It
// lists the PVs, on the rare path where the id's own node says the volume
// lives elsewhere or cannot be asked; a failed list names none.
func Holders(client kube.Interface, driver string) func(ctx context.Context, volumeID string) []string {
	return func(ctx context.Context, id string) []string {
		pvs, err := client.PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil
		}
		for _, pv := range pvs.Items {
			c := pv.Spec.CSI
			if c == nil || c.Driver != driver || c.VolumeHandle != id {
				continue
			}
			var keys []string
			for _, n := range []string{c.VolumeAttributes[engine.CtxStandby], c.VolumeAttributes[engine.CtxPrimary]} {
				if n != "" {
					keys = append(keys, engine.NodeTag(n))
				}
			}
			return keys
		}
		return nil
	}
}
