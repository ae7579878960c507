package kubepeers

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// ReferenceGrantResource is the Gateway API's ReferenceGrant, which the
// external-provisioner requires for a claim whose dataSourceRef names
// another namespace (CrossNamespaceVolumeDataSource).
var ReferenceGrantResource = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1beta1", Resource: "referencegrants"}

// Grants reads ReferenceGrants through a dynamic client: the one kind the
// driver reads from the Gateway API does not warrant its module.
type Grants struct {
	Client dynamic.Interface
}

// Allows reports whether a ReferenceGrant in namespace ns lets
// PersistentVolumeClaims of namespace from refer to the object
// group/kind/name there. Without the ReferenceGrant kind in the cluster
// nothing is granted.
func (g Grants) Allows(ctx context.Context, from, ns, group, kind, name string) (bool, error) {
	list, err := g.Client.Resource(ReferenceGrantResource).Namespace(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	for _, rg := range list.Items {
		if grants(rg.Object, from, group, kind, name) {
			return true, nil
		}
	}
	return false, nil
}

// grants reads one ReferenceGrant's spec.
func grants(obj map[string]any, from, group, kind, name string) bool {
	froms, _, _ := unstructured.NestedSlice(obj, "spec", "from")
	tos, _, _ := unstructured.NestedSlice(obj, "spec", "to")
	fromOK := false
	for _, f := range froms {
		m, _ := f.(map[string]any)
		if str(m, "group") == "" && str(m, "kind") == "PersistentVolumeClaim" && str(m, "namespace") == from {
			fromOK = true
		}
	}
	if !fromOK {
		return false
	}
	for _, t := range tos {
		m, _ := t.(map[string]any)
		if str(m, "group") == group && str(m, "kind") == kind && (str(m, "name") == "" || str(m, "name") == name) {
			return true
		}
	}
	return false
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}
