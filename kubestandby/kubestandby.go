// Package kubestandby tells a node's driver which volumes of other nodes
// it keeps a standby copy of (docs/standby.md): the PersistentVolumes of
// its driver whose context names this node as the standby. It records each
// as the PV appears and forgets it when the PV is deleted, or is found gone
// by name (a deletion missed while the driver was down); an empty or
// failed list never makes it forget a copy. It never logs: failures go to
// OnErr.
package kubestandby

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/kube"
)

// Watcher keeps a node's standby records in step with the PVs.
type Watcher struct {
	Client kube.Interface
	// Driver is the CSI driver the PVs must name; Node this node's name.
	Driver, Node string
	// Resync is how often the PVs of the copies kept are looked up by
	// name; zero means ten minutes.
	Resync time.Duration
	// Add records a copy to keep; Drop forgets the copy of a volume
	// whose PV is gone; Kept lists the copies recorded, volume id to PV
	// name.
	Add   func(engine.StandbySpec) error
	Drop  func(volumeID string) error
	Kept  func() map[string]string
	OnErr func(error)
}

// Spec is the copy a PV asks this node to keep, if it asks for one.
func (w *Watcher) Spec(pv *corev1.PersistentVolume) (engine.StandbySpec, bool) {
	src := pv.Spec.CSI
	if src == nil || src.Driver != w.Driver || src.VolumeAttributes[engine.CtxStandby] != w.Node || pv.DeletionTimestamp != nil {
		return engine.StandbySpec{}, false
	}
	a := src.VolumeAttributes
	spec := engine.StandbySpec{Volume: src.VolumeHandle, Primary: a[engine.CtxPrimary], Pool: a[engine.CtxStandbyPool],
		Access: engine.AccessMount, Layout: engine.LayoutImage, PV: pv.Name}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		spec.Access, spec.Layout = engine.AccessBlock, ""
	}
	if d, err := time.ParseDuration(a[engine.CtxStandbyInterval]); err == nil {
		spec.Interval = d
	}
	return spec, true
}

func (w *Watcher) fail(err error) {
	if w.OnErr != nil && err != nil {
		w.OnErr(err)
	}
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	resync := w.Resync
	if resync <= 0 {
		resync = 10 * time.Minute
	}
	inf := kube.Informer(w.Client, w.Client.PersistentVolumes(), &corev1.PersistentVolume{}, resync, nil)
	add := func(obj any) {
		if pv, ok := obj.(*corev1.PersistentVolume); ok {
			if spec, ok := w.Spec(pv); ok {
				if err := w.Add(spec); err != nil {
					w.fail(fmt.Errorf("keeping a copy of volume %s (PV %s) of node %s: %w", spec.Volume, pv.Name, spec.Primary, err))
				}
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, obj any) { add(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			pv, ok := obj.(*corev1.PersistentVolume)
			if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != w.Driver {
				return
			}
			// This node keeps the copy as the PV's standby, or, since a
			// move or a failover, as its first node.
			if a := pv.Spec.CSI.VolumeAttributes; a[engine.CtxStandby] != w.Node && a[engine.CtxPrimary] != w.Node {
				return
			}
			// The deletion was seen; whether the PV is really gone is
			// asked by name before anything is removed.
			w.dropIfGone(ctx, pv.Spec.CSI.VolumeHandle, pv.Name)
		},
	}); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { defer close(done); inf.Run(ctx.Done()) }()
	defer func() { <-done }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	t := time.NewTicker(resync)
	defer t.Stop()
	for {
		for id, pv := range w.Kept() {
			w.dropIfGone(ctx, id, pv)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// dropIfGone forgets the copy of volume id when the API server says its
// PV does not exist, or now names another volume or another standby.
func (w *Watcher) dropIfGone(ctx context.Context, id, pvName string) {
	if pvName == "" {
		return
	}
	pv, err := w.Client.PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		w.fail(fmt.Errorf("looking up PV %s of the copy of volume %s: %w", pvName, id, err))
		return
	case pv.Spec.CSI != nil && pv.Spec.CSI.VolumeHandle == id && pv.DeletionTimestamp == nil && pv.Spec.CSI.VolumeAttributes[engine.CtxStandby] == w.Node:
		return // still this node's to keep
	}
	if err := w.Drop(id); err != nil {
		w.fail(fmt.Errorf("forgetting the copy of volume %s (PV %s gone): %w", id, pvName, err))
	}
}
