package kubepeers

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
)

func referenceGrant(ns, name string, from []any, to []any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"from": from, "to": to},
	}}
}

// TestGrants: a claim may name a source in another namespace only where a
// ReferenceGrant there lets its namespace's claims refer to that kind (and
// name, if the grant names one).
func TestGrants(t *testing.T) {
	pvcsFrom := func(ns string) []any {
		return []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim", "namespace": ns}}
	}
	snaps := func(name string) []any {
		m := map[string]any{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}
		if name != "" {
			m["name"] = name
		}
		return []any{m}
	}
	scheme := runtime.NewScheme()
	gvrs := map[schema.GroupVersionResource]string{ReferenceGrantResource: "ReferenceGrantList"}
	g := Grants{Client: dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, gvrs,
		referenceGrant("src", "any-snapshot", pvcsFrom("dst"), snaps("")),
		referenceGrant("named", "one-snapshot", pvcsFrom("dst"), snaps("a")),
		referenceGrant("pods", "pods-only", []any{map[string]any{"group": "", "kind": "Pod", "namespace": "dst"}}, snaps("")),
	)}
	for _, c := range []struct {
		from, ns, kind, name string
		want                 bool
	}{
		{"dst", "src", "VolumeSnapshot", "x", true},
		{"other", "src", "VolumeSnapshot", "x", false},        // another namespace's claims
		{"dst", "src", "PersistentVolumeClaim", "x", false},   // another kind
		{"dst", "named", "VolumeSnapshot", "a", true},         // the name granted
		{"dst", "named", "VolumeSnapshot", "b", false},        // another name
		{"dst", "pods", "VolumeSnapshot", "x", false},         // granted to pods, not claims
		{"dst", "nothing-here", "VolumeSnapshot", "x", false}, // no grant at all
	} {
		group := "snapshot.storage.k8s.io"
		if c.kind == "PersistentVolumeClaim" {
			group = ""
		}
		got, err := g.Allows(context.Background(), c.from, c.ns, group, c.kind, c.name)
		if err != nil || got != c.want {
			t.Errorf("claims of %s naming %s %s/%s: %v %v, want %v", c.from, c.kind, c.ns, c.name, got, err, c.want)
		}
	}
}
