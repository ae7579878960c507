package kubepeers

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hostpath-csi/hostpath/kube/kubefake"
	"github.com/hostpath-csi/hostpath/transfer"
)

// Several nodes starting at once make one authority between them, all
// trusting it, through the Secret's create and update conflicts.
func TestSecretStoreOneAuthority(t *testing.T) {
	client := fake.NewClientset()
	var wg sync.WaitGroup
	creds := make([]*transfer.Credentials, 5)
	errs := make([]error, len(creds))
	for i := range creds {
		creds[i] = &transfer.Credentials{Store: &SecretStore{Client: kubefake.New(client, nil), Namespace: "ns", Name: "ca"}, Driver: "d", Node: string(rune('a' + i))}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = creds[i].Refresh(context.Background()) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	sec, err := client.CoreV1().Secrets("ns").Get(context.Background(), "ca", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cas, key, err := transfer.ParseAuthority(sec.Data, time.Now())
	if err != nil || len(cas) != 1 || key == nil {
		t.Fatalf("%d authorities, key %v: %v", len(cas), key != nil, err)
	}
	for _, c := range creds {
		if c.Expiry().IsZero() {
			t.Fatalf("node %s has no certificate", c.Node)
		}
	}
	// (The fake clientset does not check resource versions, so a stale
	// update is not tried here; the API server refuses it with Conflict.)
	s := &SecretStore{Client: kubefake.New(client, nil), Namespace: "ns", Name: "ca"}
	if err := s.Save(context.Background(), sec.Data, ""); !errors.Is(err, transfer.ErrConflict) {
		t.Fatalf("a second create: %v", err)
	}
}

// TestResolver: a key names the node whose name has it; a node whose
// driver claims another node's id is never taken for that node.
func TestResolver(t *testing.T) {
	csiNode := func(name string, drivers ...storagev1.CSINodeDriver) *storagev1.CSINode {
		return &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.CSINodeSpec{Drivers: drivers}}
	}
	node := func(name, ip string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	client := fake.NewClientset(
		// evil comes first in the list and claims n1's id.
		csiNode("a-evil", storagev1.CSINodeDriver{Name: "d", NodeID: "n1"}, storagev1.CSINodeDriver{Name: "d", NodeID: "n4"}),
		csiNode("n1", storagev1.CSINodeDriver{Name: "other.csi", NodeID: "id-x"}, storagev1.CSINodeDriver{Name: "d", NodeID: "n1"}),
		csiNode("n2", storagev1.CSINodeDriver{Name: "d", NodeID: "n2"}),
		csiNode("n3", storagev1.CSINodeDriver{Name: "d", NodeID: "id-3"}),
		node("a-evil", "10.0.0.66"), node("n1", "10.0.0.1"), node("n3", "10.0.0.3"),
	)
	r := &Resolver{Client: kubefake.New(client, nil), Driver: "d", Port: 9470, KeyOf: func(id string) string { return "k-" + id }}
	for _, c := range []struct {
		key, addr, node, inErr string
	}{
		{"k-n1", "10.0.0.1:9470", "n1", ""},
		{"k-id-x", "", "", "no node"},            // another driver's id
		{"k-n2", "", "n2", "not found"},          // its Node is gone
		{"k-id-3", "", "", "not their name"},     // a driver id that is not its node's name
		{"k-n4", "", "", "[a-evil] claim it"},    // only an impostor claims it
		{"k-n9", "", "", "the node may be gone"}, // nobody
	} {
		addr, node, err := r.Resolve(context.Background(), c.key)
		if addr != c.addr || node != c.node || (c.addr == "") != (err != nil) || (err != nil && !strings.Contains(err.Error(), c.inErr)) {
			t.Errorf("%s: %q %q %v", c.key, addr, node, err)
		}
	}
	// The nodes a list of every snapshot goes to: those Resolve trusts.
	keys, err := r.Keys(context.Background())
	if slices.Sort(keys); err != nil || !slices.Equal(keys, []string{"k-n1", "k-n2"}) {
		t.Errorf("Keys: %v %v, want k-n1 and k-n2 (no impostor, no driver id that is not its node's name)", keys, err)
	}
}

// TestSecretOwnedByDaemonSet: the authority's Secret is owned by the
// driver pod's DaemonSet, so deleting the deployment deletes it.
func TestSecretOwnedByDaemonSet(t *testing.T) {
	yes := true
	ds := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "hostpath-csi-node", UID: "ds-uid", Controller: &yes, BlockOwnerDeletion: &yes}
	client := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hostpath-csi-node-x", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{ds}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "ns"}})
	owner, err := ControllerOf(context.Background(), kubefake.New(client, nil), "ns", "hostpath-csi-node-x")
	if err != nil || owner == nil || owner.UID != "ds-uid" || owner.BlockOwnerDeletion != nil {
		t.Fatalf("controller of the driver pod: %+v %v", owner, err)
	}
	if o, err := ControllerOf(context.Background(), kubefake.New(client, nil), "ns", "bare"); o != nil || err != nil {
		t.Fatalf("a pod without a controller: %+v %v", o, err)
	}
	s := &SecretStore{Client: kubefake.New(client, nil), Namespace: "ns", Name: "auth", Owner: owner}
	for _, version := range []string{"", "1"} {
		if err := s.Save(context.Background(), map[string][]byte{"k": []byte(version)}, version); err != nil {
			t.Fatal(err)
		}
		sec, err := client.CoreV1().Secrets("ns").Get(context.Background(), "auth", metav1.GetOptions{})
		if err != nil || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != "ds-uid" {
			t.Fatalf("after save %q the Secret's owners are %+v (%v)", version, sec.OwnerReferences, err)
		}
	}
}
