package main

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hostpath-csi/hostpath/kube/kubefake"
)

// TestPVEvent: a note about a volume is a Warning event on its
// PersistentVolume, in the default namespace, naming it by UID (what
// kubectl describe pv selects on), from the driver on its node; a PV that
// is not there is an error, and no event.
func TestPVEvent(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1", UID: "uid-1"}})
	if err := pvEvent(ctx, kubefake.New(client, nil), "hostpath.csi.k8s.io", "node-1", "pvc-1", "FileSystemNotGrown", "staged smaller"); err != nil {
		t.Fatal(err)
	}
	if err := pvEvent(ctx, kubefake.New(client, nil), "hostpath.csi.k8s.io", "node-1", "pvc-gone", "FileSystemNotGrown", "staged smaller"); err == nil {
		t.Fatal("an event on a PV that does not exist was made")
	}
	evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 {
		t.Fatalf("%d events, want 1", len(evs.Items))
	}
	e := evs.Items[0]
	if e.InvolvedObject.Kind != "PersistentVolume" || e.InvolvedObject.UID != "uid-1" || e.Type != corev1.EventTypeWarning ||
		e.Reason != "FileSystemNotGrown" || e.Source.Host != "node-1" || e.ReportingController != "hostpath.csi.k8s.io" {
		t.Fatalf("event %+v", e)
	}
}
