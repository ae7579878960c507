package kubestandby

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/kube/kubefake"
)

func pv(name, driver, handle, standby string, block bool) *corev1.PersistentVolume {
	p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle,
			VolumeAttributes: map[string]string{engine.CtxStandby: standby, engine.CtxPrimary: "node-1", engine.CtxStandbyPool: "fast", engine.CtxStandbyInterval: "5s"}}}}}
	if block {
		m := corev1.PersistentVolumeBlock
		p.Spec.VolumeMode = &m
	}
	return p
}

// TestWatcher: the PVs of this driver naming this node as the standby are
// recorded as copies to keep (block or image, their pool and interval);
// others are not; a deleted PV's copy is forgotten, and so is one whose PV
// is found gone at start, but not one whose PV is there.
func TestWatcher(t *testing.T) {
	const d = "hostpath.csi.k8s.io"
	client := fake.NewClientset(
		pv("pv-block", d, "vol-a", "node-2", true),
		pv("pv-image", d, "vol-b", "node-2", false),
		pv("pv-elsewhere", d, "vol-c", "node-3", true),
		pv("pv-other", "other.csi", "vol-d", "node-2", true),
		pv("pv-kept", d, "vol-e", "node-2", true),
		moved(pv("pv-moved", d, "vol-m", "node-3", true)),
	)
	var mu sync.Mutex
	added, dropped := map[string]engine.StandbySpec{}, []string{}
	w := &Watcher{Client: kubefake.New(client, nil), Driver: d, Node: "node-2", Resync: time.Hour,
		Add: func(s engine.StandbySpec) error {
			mu.Lock()
			defer mu.Unlock()
			added[s.Volume] = s
			return nil
		},
		Drop: func(id string) error {
			mu.Lock()
			defer mu.Unlock()
			dropped = append(dropped, id)
			return nil
		},
		Kept:  func() map[string]string { return map[string]string{"vol-e": "pv-kept", "vol-gone": "pv-gone"} },
		OnErr: func(err error) { t.Error(err) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	snapshot := func() (map[string]engine.StandbySpec, []string) {
		mu.Lock()
		defer mu.Unlock()
		a := map[string]engine.StandbySpec{}
		for k, v := range added {
			a[k] = v
		}
		return a, slices.Clone(dropped)
	}
	testutil.WaitFor(t, 30*time.Second, "the PVs naming node-2 were not all recorded, nor the gone one dropped", func() bool {
		a, dr := snapshot()
		return len(a) == 3 && slices.Contains(dr, "vol-gone")
	})
	a, dr := snapshot()
	want := engine.StandbySpec{Volume: "vol-a", Primary: "node-1", Pool: "fast", Access: engine.AccessBlock, Interval: 5 * time.Second, PV: "pv-block"}
	if a["vol-a"] != want {
		t.Errorf("block: %+v, want %+v", a["vol-a"], want)
	}
	if s := a["vol-b"]; s.Access != engine.AccessMount || s.Layout != engine.LayoutImage {
		t.Errorf("image: %+v", s)
	}
	if _, ok := a["vol-c"]; ok {
		t.Error("a copy recorded for another node's standby")
	}
	if _, ok := a["vol-d"]; ok {
		t.Error("a copy recorded for another driver's PV")
	}
	if slices.Contains(dr, "vol-e") {
		t.Error("a copy whose PV is there was dropped")
	}
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, "pv-block", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the deleted PV's copy was not dropped", func() bool {
		_, dr := snapshot()
		return slices.Contains(dr, "vol-a")
	})
	// A PV naming this node its primary: after a move or a failover this
	// node keeps the copy, which goes with the PV too.
	if err := client.CoreV1().PersistentVolumes().Delete(ctx, "pv-moved", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the copy kept by the PV's first node was not dropped with its PV", func() bool {
		_, dr := snapshot()
		return slices.Contains(dr, "vol-m")
	})
}

// moved makes p a PV whose first node is node-2 (the watcher's).
func moved(p *corev1.PersistentVolume) *corev1.PersistentVolume {
	p.Spec.CSI.VolumeAttributes[engine.CtxPrimary] = "node-2"
	return p
}

// TestFences: a node is fenced by the out-of-service taint or by its Node
// deleted, never by being NotReady or by other taints.
func TestFences(t *testing.T) {
	node := func(name string, ready corev1.ConditionStatus, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
	}
	client := fake.NewClientset(
		node("up", corev1.ConditionTrue),
		node("unreachable", corev1.ConditionUnknown,
			corev1.Taint{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute}),
		node("out", corev1.ConditionUnknown,
			corev1.Taint{Key: OutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute}),
	)
	fenced := Fences(kubefake.New(client, nil))
	for _, tc := range []struct {
		node   string
		fenced bool
	}{{"up", false}, {"unreachable", false}, {"out", true}, {"deleted", true}} {
		how, err := fenced(context.Background(), tc.node)
		if err != nil || (how != "") != tc.fenced {
			t.Errorf("node %s: fenced %q (%v), want fenced %v", tc.node, how, err, tc.fenced)
		}
	}
}

// TestHolders: the nodes a volume's PV names (its standby, then its
// primary), by their keys; none for a volume of another driver or without
// a copy.
func TestHolders(t *testing.T) {
	const d = "hostpath.csi.k8s.io"
	client := fake.NewClientset(pv("pv-a", d, "vol-a", "node-2", true), pv("pv-o", "other.csi", "vol-o", "node-2", true))
	holders := Holders(kubefake.New(client, nil), d)
	if got, want := holders(context.Background(), "vol-a"), []string{engine.NodeTag("node-2"), engine.NodeTag("node-1")}; !slices.Equal(got, want) {
		t.Errorf("vol-a: %v, want %v", got, want)
	}
	for _, id := range []string{"vol-o", "vol-none"} {
		if got := holders(context.Background(), id); len(got) != 0 {
			t.Errorf("%s: %v, want none", id, got)
		}
	}
}
