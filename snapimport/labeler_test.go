package snapimport

import (
	"context"
	"sync"
	"testing"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/fake"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/kube/kubefake"
)

func content(name, driver, handle, volume string, labels map[string]string) *snapv1.VolumeSnapshotContent {
	c := &snapv1.VolumeSnapshotContent{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	c.Spec.Driver = driver
	if handle != "" {
		c.Spec.Source.SnapshotHandle = &handle
	}
	if volume != "" {
		c.Spec.Source.VolumeHandle = &volume
	}
	return c
}

// TestLabeler: only the imported contents of this driver whose snapshot
// this node holds get the label, naming this node; dynamic contents,
// another driver's, one labelled already and one held elsewhere are left
// as they are, also when they arrive after the start.
func TestLabeler(t *testing.T) {
	// The fake clientset of the snapshot client library answers no
	// watch-list request (it never sends the bookmark that ends the
	// initial list), which client-go's informers make by default.
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	const driver, node = "hostpath.csi.k8s.io", "node-2"
	client := fake.NewSimpleClientset( //nolint:staticcheck // the snapshot clientset has no apply configurations, so no NewClientset
		content("imported-here", driver, "snap-here", "", nil),
		content("imported-elsewhere", driver, "snap-elsewhere", "", nil),
		content("other-driver", "other.csi", "snap-here", "", nil),
		content("labelled", driver, "snap-here", "", map[string]string{ManagedByLabel: "node-1"}),
		content("dynamic", driver, "", "vol-1", nil),
	)
	var mu sync.Mutex
	done := map[string]error{}
	l := &Labeler{Client: kubefake.New(nil, client), Driver: driver, Node: node, Resync: time.Minute,
		Holds: func(h string) bool { return h == "snap-here" || h == "snap-late" },
		Labelled: func(c string, err error) {
			mu.Lock()
			done[c] = err
			mu.Unlock()
		}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- l.Run(ctx) }()
	wait := func(name string) {
		t.Helper()
		for i := 0; i < 600; i++ { // 30 s
			mu.Lock()
			err, ok := done[name]
			mu.Unlock()
			if ok {
				if err != nil {
					t.Fatalf("labelling %s: %v", name, err)
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s not labelled in 30 s", name)
	}
	wait("imported-here")
	if _, err := client.SnapshotV1().VolumeSnapshotContents().Create(ctx, content("imported-late", driver, "snap-late", "", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("imported-late")
	want := map[string]string{"imported-here": node, "imported-late": node, "imported-elsewhere": "", "other-driver": "", "labelled": "node-1", "dynamic": ""}
	for name, label := range want {
		c, err := client.SnapshotV1().VolumeSnapshotContents().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Labels[ManagedByLabel]; got != label {
			t.Errorf("%s: label %q, want %q", name, got, label)
		}
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
