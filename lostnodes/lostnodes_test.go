package lostnodes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hostpath-csi/hostpath/kube/kubefake"
)

const (
	driver = "hostpath.csi.k8s.io"
	key    = "topology.hostpath.csi/node"
)

func node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{key: name}}}
}

func pv(name, on, claim string, drv string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: drv, VolumeHandle: name}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "app", Name: claim, UID: types.UID("uid-" + claim)},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{on}}},
			}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound},
	}
}

func pod(name, claim, nodeName string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "app", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: nodeName, Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// TestScan: a pod waiting for a volume whose node is gone, and its claim,
// get an event naming the node, once per scan counted on one event; pods
// of live nodes, scheduled pods, other drivers' volumes and drivers that
// are not the reporter leave nothing.
func TestScan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		self    string
		objects []runtime.Object
		want    []string // kind/name@node told
	}{
		{"pod and claim of a lost node", "node-1", []runtime.Object{
			node("node-1"), node("node-3"),
			pv("pv-a", "node-2", "data-web-1", driver), pod("web-1", "data-web-1", "", corev1.PodPending),
		}, []string{"Pod/web-1@node-2", "PersistentVolumeClaim/data-web-1@node-2"}},
		{"not the reporting driver", "node-3", []runtime.Object{
			node("node-1"), node("node-3"),
			pv("pv-a", "node-2", "data-web-1", driver), pod("web-1", "data-web-1", "", corev1.PodPending),
		}, nil},
		{"node alive", "node-1", []runtime.Object{
			node("node-1"), node("node-2"),
			pv("pv-a", "node-2", "data-web-1", driver), pod("web-1", "data-web-1", "", corev1.PodPending),
		}, nil},
		{"another driver's volume", "node-1", []runtime.Object{
			node("node-1"),
			pv("pv-a", "node-2", "data-web-1", "other.csi"), pod("web-1", "data-web-1", "", corev1.PodPending),
		}, nil},
		{"pod scheduled or running elsewhere", "node-1", []runtime.Object{
			node("node-1"),
			pv("pv-a", "node-2", "data-web-1", driver), pod("web-1", "data-web-1", "node-1", corev1.PodRunning),
		}, nil},
		{"claim no pod waits for", "node-1", []runtime.Object{
			node("node-1"), pv("pv-a", "node-2", "data-web-1", driver),
		}, nil},
		{"node there without the driver", "node-1", []runtime.Object{
			node("node-1"), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"}},
			pv("pv-a", "node-2", "data-web-1", driver), pod("web-1", "data-web-1", "", corev1.PodPending),
		}, []string{"Pod/web-1@node-2:" + ReasonNoDriver, "PersistentVolumeClaim/data-web-1@node-2:" + ReasonNoDriver}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objects...)
			w := &Watcher{Client: kubefake.New(client, nil), Driver: driver, TopologyKey: key, Self: tc.self, Now: func() time.Time { return time.Unix(1e9, 0) }}
			for scan := 1; scan <= 2; scan++ {
				told, err := w.Scan(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, l := range told {
					o := l.Object.Kind + "/" + l.Object.Name + "@" + l.Node
					if l.Reason != Reason {
						o += ":" + l.Reason
					}
					got = append(got, o)
				}
				if strings.Join(got, " ") != strings.Join(tc.want, " ") {
					t.Fatalf("scan %d told %v, want %v", scan, got, tc.want)
				}
			}
			events, err := client.CoreV1().Events("app").List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(events.Items) != len(tc.want) {
				t.Fatalf("%d events, want %d", len(events.Items), len(tc.want))
			}
			for _, e := range events.Items {
				reason, says := Reason, "node-2, which is no longer in the cluster"
				if strings.HasSuffix(tc.want[0], ReasonNoDriver) {
					reason, says = ReasonNoDriver, "node-2, which is in the cluster but does not offer driver"
				}
				if e.Count != 2 || e.Type != corev1.EventTypeWarning || e.Reason != reason || !strings.Contains(e.Message, says) {
					t.Fatalf("event %+v: want a Warning %s counted twice saying %q", e, reason, says)
				}
				if reason == ReasonNoDriver && strings.Contains(e.Message, "delete the claim") {
					t.Fatalf("a node that is there is said to be gone: %s", e.Message)
				}
			}
		})
	}
}

// TestScanGoesOnPastAFailedEvent: an event that cannot be written is
// reported, and the other pods and claims are still told (the first
// version stopped the scan at it).
func TestScanGoesOnPastAFailedEvent(t *testing.T) {
	client := fake.NewClientset(node("node-1"),
		pv("pv-a", "node-2", "data-a", driver), pod("a", "data-a", "", corev1.PodPending),
		pv("pv-b", "node-2", "data-b", driver), pod("b", "data-b", "", corev1.PodPending))
	client.PrependReactor("create", "events", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if ev := action.(k8stesting.CreateAction).GetObject().(*corev1.Event); ev.InvolvedObject.Name == "a" {
			return true, nil, errors.New("the API server refused it")
		}
		return false, nil, nil
	})
	w := &Watcher{Client: kubefake.New(client, nil), Driver: driver, TopologyKey: key, Self: "node-1"}
	told, err := w.Scan(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Pod app/a") {
		t.Fatalf("scan error %v, want the failed event named", err)
	}
	var got []string
	for _, l := range told {
		got = append(got, l.Object.Kind+"/"+l.Object.Name)
	}
	if strings.Join(got, " ") != "Pod/b PersistentVolumeClaim/data-a PersistentVolumeClaim/data-b" {
		t.Fatalf("told %v, want every other pod and claim", got)
	}
}
