package kubepeers

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	groupv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumegroupsnapshot/v1"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapfake "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/fake"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hostpath-csi/hostpath/kube/kubefake"
	"github.com/hostpath-csi/hostpath/transfer"
)

func ptr[T any](v T) *T { return &v }

// claim is a claim in ns, selected for node ("" for none), in phase,
// filled from ref (nil for none).
func claim(ns, name, node string, phase corev1.PersistentVolumeClaimPhase, ref *corev1.TypedObjectReference) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name), Annotations: map[string]string{}},
		Status:     corev1.PersistentVolumeClaimStatus{Phase: phase},
	}
	if node != "" {
		c.Annotations[SelectedNodeAnnotation] = node
	}
	if ref != nil {
		c.Spec.DataSourceRef = ref
		if ref.Namespace == nil {
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ref.APIGroup, Kind: ref.Kind, Name: ref.Name}
		}
	}
	return c
}

func fromSnapshot(name string) *corev1.TypedObjectReference {
	return &corev1.TypedObjectReference{APIGroup: ptr("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: name}
}

func fromClaim(name string) *corev1.TypedObjectReference {
	return &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: name}
}

// snapshot is a VolumeSnapshot in ns bound to a content of driver with
// handle (in its status), whose reference back names the snapshot
// refNS/refName, labelled managed-by node ("" for none).
func snapshot(ns, name, content, driver, handle, refNS, refName, node string) []runtime.Object {
	vsc := &snapv1.VolumeSnapshotContent{ObjectMeta: metav1.ObjectMeta{Name: content},
		Spec:   snapv1.VolumeSnapshotContentSpec{Driver: driver, VolumeSnapshotRef: corev1.ObjectReference{Namespace: refNS, Name: refName}},
		Status: &snapv1.VolumeSnapshotContentStatus{SnapshotHandle: ptr(handle)}}
	if node != "" {
		vsc.Labels = map[string]string{ManagedByLabel: node}
	}
	return []runtime.Object{
		&snapv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Status: &snapv1.VolumeSnapshotStatus{BoundVolumeSnapshotContentName: ptr(content)}},
		vsc,
	}
}

// volume is a volume of driver with handle bound to the claim
// claimNS/claimName, its node affinity node.
func volume(name, driver, handle, claimNS, claimName, node string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}},
		ClaimRef:               &corev1.ObjectReference{Namespace: claimNS, Name: claimName, UID: types.UID(claimNS + "/" + claimName)},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: topologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
		}}}},
	}}
}

const topologyKey = "topology.hostpath.csi/node"

// TestPendingAuthorizes: a node gets a source only while a claim to be
// filled from it waits on that node, from the object the serving node's
// (n1's) own record says the source was made for; API objects another
// node may write (a content's status handle, a PV naming any handle, a
// claim's dataSourceRef into another namespace) get it nothing.
func TestPendingAuthorizes(t *testing.T) {
	const d = "hostpath.csi.k8s.io"
	bound := func(ns, name, pv string) *corev1.PersistentVolumeClaim {
		c := claim(ns, name, "", corev1.ClaimBound, nil)
		c.Spec.VolumeName = pv
		return c
	}
	across := func(ns, kind, group, name string) *corev1.TypedObjectReference {
		return &corev1.TypedObjectReference{APIGroup: ptr(group), Kind: kind, Name: name, Namespace: ptr(ns)}
	}
	kube := fake.NewClientset(
		claim("app", "restore", "n2", corev1.ClaimPending, fromSnapshot("snap")),
		claim("app", "restored", "n4", corev1.ClaimBound, fromSnapshot("snap")),
		claim("app", "unscheduled", "", corev1.ClaimPending, fromSnapshot("snap")),
		claim("app", "foreign", "n5", corev1.ClaimPending, fromSnapshot("foreign-snap")),
		claim("app", "misbound", "n6", corev1.ClaimPending, fromSnapshot("misbound-snap")),
		claim("app", "same-ns", "n7", corev1.ClaimPending, across("app", "VolumeSnapshot", "snapshot.storage.k8s.io", "snap")),
		claim("evil", "redirect", "n9", corev1.ClaimPending, fromSnapshot("evil-snap")),
		claim("evil", "forged", "n9", corev1.ClaimPending, fromSnapshot("mine")),
		claim("evil", "ungranted", "n9", corev1.ClaimPending, across("app", "VolumeSnapshot", "snapshot.storage.k8s.io", "snap")),
		claim("granted", "granted", "n10", corev1.ClaimPending, across("app", "VolumeSnapshot", "snapshot.storage.k8s.io", "snap")),
		claim("app", "legacy", "n2", corev1.ClaimPending, fromSnapshot("old-snap")),
		claim("app", "legacy-foreign", "n9", corev1.ClaimPending, fromSnapshot("old-snap-9")),
		claim("app", "member-restore", "n2", corev1.ClaimPending, fromSnapshot("member")),
		claim("app", "member-status", "n2", corev1.ClaimPending, fromSnapshot("member-status")),
		claim("app", "gm-restore", "n2", corev1.ClaimPending, fromSnapshot("gm")),
		claim("app", "gm-other-restore", "n3", corev1.ClaimPending, fromSnapshot("gm-other")),
		claim("app", "gm-stale-restore", "n2", corev1.ClaimPending, fromSnapshot("gm-stale")),
		claim("app", "clone", "n3", corev1.ClaimPending, fromClaim("src")),
		bound("app", "src", "pv-src"), volume("pv-src", d, "vol-1", "app", "src", "n1"),
		claim("evil", "clone-stolen", "n9", corev1.ClaimPending, fromClaim("src2")),
		bound("evil", "src2", "pv-evil"), volume("pv-evil", d, "vol-1", "evil", "src2", "n9"),
		claim("app", "clone-old", "n3", corev1.ClaimPending, fromClaim("old")),
		bound("app", "old", "pv-old"), volume("pv-old", d, "vol-old", "app", "old", "n1"),
		claim("evil", "clone-old-stolen", "n9", corev1.ClaimPending, fromClaim("old2")),
		bound("evil", "old2", "pv-old2"), volume("pv-old2", d, "vol-old", "evil", "old2", "n9"),
	)
	var objs []runtime.Object
	// fromVolume is a snapshot whose content the snapshot-controller made
	// of the volume with that handle (in its spec).
	fromVolume := func(o []runtime.Object, handle string) []runtime.Object {
		o[1].(*snapv1.VolumeSnapshotContent).Spec.Source.VolumeHandle = ptr(handle)
		return o
	}
	objs = append(objs, fromVolume(snapshot("app", "snap", "content-1", d, "snap-1", "app", "snap", "n1"), "vol-1")...)
	// A snapshot of evil's own volume, whose name a taken node holding the
	// controller's certificate gave as the owner of its snapshot of app's
	// volume (CreateSnapshot's parameters are the caller's to write).
	objs = append(objs, fromVolume(snapshot("evil", "mine", "content-mine", d, "snap-mine", "evil", "mine", ""), "vol-evil")...)
	objs = append(objs, snapshot("app", "foreign-snap", "content-2", "other.csi", "snap-2", "app", "foreign-snap", "n1")...)
	objs = append(objs, snapshot("app", "misbound-snap", "content-3", d, "snap-3", "app", "another-snap", "n1")...)
	// A content whose status handle a taken node wrote: n9's own.
	objs = append(objs, snapshot("evil", "evil-snap", "content-evil", d, "snap-1", "evil", "evil-snap", "n9")...)
	objs = append(objs, snapshot("app", "old-snap", "content-old", d, "snap-old", "app", "old-snap", "n1")...)
	objs = append(objs, snapshot("app", "old-snap-9", "content-old-9", d, "snap-old", "app", "old-snap-9", "n9")...)
	// A pre-provisioned content (a cluster admin's: no node may make one
	// or change a spec) with the handle in its spec, unlabelled, no owner
	// recorded. And one whose handle is only in its status, unlabelled:
	// not enough.
	member := snapshot("app", "member", "content-member", d, "", "app", "member", "")
	member[1].(*snapv1.VolumeSnapshotContent).Spec.Source.SnapshotHandle = ptr("snap-member")
	member[1].(*snapv1.VolumeSnapshotContent).Status = nil
	objs = append(objs, member...)
	objs = append(objs, snapshot("app", "member-status", "content-member-status", d, "snap-member-status", "app", "member-status", "")...)
	legacyMembers := map[string]bool{"snap-member": true, "snap-member-status": true}
	// Members of the VolumeGroupSnapshot app/db (bound to groupcontent-1):
	// each a VolumeSnapshot the snapshot-controller made, naming the group
	// in its status, bound to an unlabelled content with the handle in its
	// status; the node recorded the group as their owner.
	groupMember := func(name, content, handle, group string) []runtime.Object {
		o := snapshot("app", name, content, d, handle, "app", name, "")
		o[0].(*snapv1.VolumeSnapshot).Status.VolumeGroupSnapshotName = ptr(group)
		return o
	}
	objs = append(objs, groupMember("gm", "content-gm", "snap-gm", "db")...)
	objs = append(objs, groupMember("gm-other", "content-gm-other", "snap-gm", "other")...)
	objs = append(objs, groupMember("gm-stale", "content-gm-stale", "snap-gm-stale", "db")...)
	objs = append(objs, &groupv1.VolumeGroupSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "db"},
		Status: &groupv1.VolumeGroupSnapshotStatus{BoundVolumeGroupSnapshotContentName: ptr("groupcontent-1")}})
	owners := map[string]Owner{
		"snap-1": {Namespace: "app", Name: "snap", Object: "content-1", Source: "vol-1"}, "snap-2": {Namespace: "app", Name: "foreign-snap", Object: "content-x"},
		"snap-forged": {Namespace: "evil", Name: "mine", Object: "content-mine", Source: "vol-app"},
		"snap-3":      {Namespace: "app", Name: "misbound-snap", Object: "content-x"},
		"vol-1":       {Namespace: "app", Name: "src", Object: "pv-src"},
		"snap-gm":     {Namespace: "app", Name: "db", Object: "groupcontent-1", Group: true},
		// A member of an earlier group of that name, bound elsewhere.
		"snap-gm-stale": {Namespace: "app", Name: "db", Object: "groupcontent-0", Group: true},
	}
	legacy := map[string]bool{"snap-old": true, "vol-old": true}
	p := &Pending{Client: kubefake.New(kube, snapfake.NewSimpleClientset(objs...)), Driver: d, Node: "n1", TopologyKey: topologyKey, //nolint:staticcheck // external-snapshotter generates no NewClientset
		SnapshotKind: "snapshot", VolumeKind: "volume",
		Owners: func(kind, id string) (Owner, bool, bool) {
			o, ok := owners[id]
			return o, ok || legacy[id] || legacyMembers[id], ok
		},
		Grants: func(_ context.Context, from, ns, group, kind, name string) (bool, error) {
			return from == "granted" && ns == "app" && group == "snapshot.storage.k8s.io" && kind == "VolumeSnapshot" && name == "snap", nil
		},
	}
	for _, c := range []struct {
		peer, kind, id string
		want           error // nil: allowed
	}{
		{"n2", "snapshot", "snap-1", nil},                             // its restore waits on n2
		{"n3", "snapshot", "snap-1", transfer.ErrRefused},             // nothing of it waits on n3
		{"n2", "snapshot", "snap-9", transfer.ErrRefused},             // not a snapshot of this node
		{"n2", "volume", "snap-1", transfer.ErrRefused},               // the kind must match too
		{"n4", "snapshot", "snap-1", transfer.ErrRefused},             // its claim is bound already
		{"", "snapshot", "snap-1", transfer.ErrRefused},               // a claim not yet scheduled names no node
		{"n5", "snapshot", "snap-2", transfer.ErrRefused},             // not the snapshot recorded
		{"n6", "snapshot", "snap-3", transfer.ErrRefused},             // not the content recorded
		{"n7", "snapshot", "snap-1", nil},                             // a dataSourceRef naming its own namespace
		{"n9", "snapshot", "snap-1", transfer.ErrRefused},             // a content whose status handle n9 wrote
		{"n9", "snapshot", "snap-forged", transfer.ErrRefused},        // an owner forged in CreateSnapshot's parameters: its content is of another volume
		{"n9", "snapshot", "snap-1", transfer.ErrRefused},             // from another namespace, no grant
		{"n10", "snapshot", "snap-1", nil},                            // from another namespace, granted
		{"n2", "snapshot", "snap-old", nil},                           // no owner recorded: a content managed by n1
		{"n9", "snapshot", "snap-old", transfer.ErrRefused},           // no owner recorded: a content managed by n9
		{"n3", "volume", "vol-1", nil},                                // a clone waits on n3
		{"n2", "volume", "vol-1", transfer.ErrRefused},                // not on n2
		{"n9", "volume", "vol-1", transfer.ErrRefused},                // a PV n9 made naming vol-1
		{"n3", "volume", "vol-old", nil},                              // no owner recorded: a PV of n1
		{"n9", "volume", "vol-old", transfer.ErrRefused},              // no owner recorded: a PV of n9
		{"n3", "archive", "vol-1", transfer.ErrRefused},               // a kind not served
		{"n2", "snapshot", "snap-member", nil},                        // a group member: its handle in the content's spec
		{"n2", "snapshot", "snap-member-status", transfer.ErrRefused}, // unlabelled, its handle only in the status
		{"n9", "snapshot", "snap-member", transfer.ErrRefused},        // nothing of it waits on n9
		{"n2", "snapshot", "snap-gm", nil},                            // a member of the group recorded, restored on n2
		{"n3", "snapshot", "snap-gm", transfer.ErrRefused},            // a snapshot of another group, whose content names the handle
		{"n2", "snapshot", "snap-gm-stale", transfer.ErrRefused},      // the group is bound to another content than recorded
	} {
		err := p.Authorize(context.Background(), c.peer, c.kind, c.id)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s asks for %s %s: %v, want %v", c.peer, c.kind, c.id, err, c.want)
		}
	}
}

// TestPendingListsAtMostEveryMaxAge: however many requests come, the
// claims are listed once per MaxAge; a list that fails is a busy answer
// (the peer retries), never an allowance.
func TestPendingListsAtMostEveryMaxAge(t *testing.T) {
	kube := fake.NewClientset(claim("app", "clone", "n3", corev1.ClaimPending, fromClaim("src")))
	var lists atomic.Int64
	var fail atomic.Bool
	kube.PrependReactor("list", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		if fail.Load() {
			return true, nil, errors.New("the API server is down")
		}
		return false, nil, nil
	})
	now := time.Unix(1e9, 0)
	p := &Pending{Client: kubefake.New(kube, snapfake.NewSimpleClientset()), Driver: "d", SnapshotKind: "snapshot", VolumeKind: "volume", //nolint:staticcheck // external-snapshotter generates no NewClientset
		MaxAge: time.Second, Now: func() time.Time { return now },
		Owners: func(string, string) (Owner, bool, bool) { return Owner{}, true, false }}
	done := make(chan error)
	for range 20 {
		go func() { done <- p.Authorize(context.Background(), "n3", "volume", "vol-x") }()
	}
	for range 20 {
		if err := <-done; !errors.Is(err, transfer.ErrRefused) {
			t.Fatal(err)
		}
	}
	if n := lists.Load(); n != 1 {
		t.Fatalf("20 requests within MaxAge listed the claims %d times", n)
	}
	now = now.Add(2 * time.Second)
	fail.Store(true)
	err := p.Authorize(context.Background(), "n3", "volume", "vol-x")
	if !errors.Is(err, transfer.ErrBusy) || !strings.Contains(err.Error(), "API server is down") || lists.Load() != 2 {
		t.Fatalf("with the API down: %v after %d lists", err, lists.Load())
	}
}
