package snapimport

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/hostpath-csi/hostpath/kube"
)

// ManagedByLabel is the label by which the snapshot-controller (with
// distributed snapshotting) and a node-deployed csi-snapshotter tell which
// node handles a VolumeSnapshotContent.
const ManagedByLabel = "snapshot.storage.kubernetes.io/managed-by"

// Labeler labels the imported contents of one driver that this node holds.
type Labeler struct {
	Client kube.Interface
	// Driver is the CSI driver name the contents must name.
	Driver string
	// Node is this node's name, the label's value.
	Node string
	// Holds says whether this node has the snapshot with this handle.
	Holds func(handle string) bool
	// Resync is how often every unlabelled content is looked at again
	// (a snapshot restored from a backup after its content was made).
	Resync time.Duration
	// Labelled, when set, is told each content labelled, or the error.
	Labelled func(content string, err error)
}

// Run watches the unlabelled contents until ctx is done.
func (l *Labeler) Run(ctx context.Context) error {
	inf := kube.Informer(l.Client, l.Client.VolumeSnapshotContents(), &snapv1.VolumeSnapshotContent{}, l.Resync,
		func(o *metav1.ListOptions) { o.LabelSelector = "!" + ManagedByLabel })
	handle := func(obj any) {
		if c, ok := obj.(*snapv1.VolumeSnapshotContent); ok {
			l.consider(ctx, c)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		return err
	}
	var informing sync.WaitGroup
	informing.Go(func() { inf.Run(ctx.Done()) })
	defer informing.Wait()
	// Until ctx is done: the informer lists again on its own after an
	// error, and a content it misses now comes back at the next resync.
	<-ctx.Done()
	if !inf.HasSynced() {
		return fmt.Errorf("VolumeSnapshotContents were never listed (is the snapshot CRD installed, and may this service account list them?)")
	}
	return nil
}

// Imported returns the snapshot handle of a content of driver that was
// written with one and carries no managed-by label.
func Imported(c *snapv1.VolumeSnapshotContent, driver string) (string, bool) {
	if c.Spec.Driver != driver || c.Spec.Source.SnapshotHandle == nil || *c.Spec.Source.SnapshotHandle == "" {
		return "", false
	}
	if _, ok := c.Labels[ManagedByLabel]; ok {
		return "", false
	}
	return *c.Spec.Source.SnapshotHandle, true
}

func (l *Labeler) consider(ctx context.Context, c *snapv1.VolumeSnapshotContent) {
	h, ok := Imported(c, l.Driver)
	if !ok || !l.Holds(h) {
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{ManagedByLabel: l.Node}}})
	if err == nil {
		_, err = l.Client.VolumeSnapshotContents().Patch(ctx, c.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if l.Labelled != nil {
		l.Labelled(c.Name, err)
	}
}
