package kubepeers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hostpath-csi/hostpath/transfer"
)

// SelectedNodeAnnotation is where the scheduler writes the node a
// WaitForFirstConsumer claim is to be provisioned on; a node-deployed
// provisioner takes only the claims selected for its node.
const SelectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// Pending is the transfer's Authorizer for the CSI driver: a node may have
// a source (a snapshot, a volume) only while a claim that restores or
// clones it waits to be provisioned on that node, as the API server
// records it: Pending, selected for that node, its data source a
// VolumeSnapshot whose content is this driver's with that snapshot handle,
// or a claim bound to a volume of this driver with that volume handle.
//
// The claims are listed at most every MaxAge (from the API server's watch
// cache), however many requests come; the data sources of the claims
// selected for the asking node are looked up as asked, once per list.
type Pending struct {
	Client    kubernetes.Interface
	Snapshots versioned.Interface
	Driver    string
	// SnapshotKind and VolumeKind are the transfer's names of the two
	// kinds of source.
	SnapshotKind, VolumeKind string
	// MaxAge is how long a list of the pending claims is used; zero means
	// two seconds (a restore asks within moments of its claim's
	// selection, and asks again if refused).
	MaxAge time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	current *claimList
	listing chan struct{} // closed when the list being made ends
}

// claimList is one list of the pending claims, with the source handles
// looked up while it is current.
type claimList struct {
	at      time.Time
	claims  []pendingClaim
	handles map[pendingClaim]string
}

// pendingClaim is a claim's wait: the node it is selected for and the
// source it is to be filled from (kind, namespace/name of the
// VolumeSnapshot or claim).
type pendingClaim struct {
	node, kind, namespace, name string
}

func (p *Pending) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// Authorize implements transfer.Authorizer.
func (p *Pending) Authorize(ctx context.Context, peer, kind, id string) error {
	if kind != p.SnapshotKind && kind != p.VolumeKind {
		return fmt.Errorf("%w: no source of kind %q is served", transfer.ErrRefused, kind)
	}
	list, err := p.list(ctx)
	if err != nil {
		return fmt.Errorf("%w: the pending claims could not be listed: %v", transfer.ErrBusy, err)
	}
	var lookupErr error
	for _, c := range list.claims {
		if c.node != peer || c.kind != kind {
			continue
		}
		p.mu.Lock()
		handle, ok := list.handles[c]
		p.mu.Unlock()
		if !ok {
			if handle, err = p.handleOf(ctx, c); err != nil {
				lookupErr = err
				continue
			}
			p.mu.Lock()
			list.handles[c] = handle
			p.mu.Unlock()
		}
		if handle != "" && handle == id {
			return nil
		}
	}
	if lookupErr != nil {
		return fmt.Errorf("%w: %v", transfer.ErrBusy, lookupErr)
	}
	return fmt.Errorf("%w: no claim to be filled from %s %s waits for node %s", transfer.ErrRefused, kind, id, peer)
}

// list returns a list of the pending claims no older than MaxAge, making
// one if there is none; one list is made at a time, and the requests that
// come meanwhile wait for it.
func (p *Pending) list(ctx context.Context) (*claimList, error) {
	maxAge := p.MaxAge
	if maxAge <= 0 {
		maxAge = 2 * time.Second
	}
	p.mu.Lock()
	for {
		if l := p.current; l != nil && p.now().Sub(l.at) < maxAge {
			p.mu.Unlock()
			return l, nil
		}
		if p.listing == nil {
			break
		}
		wait := p.listing
		p.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		p.mu.Lock()
	}
	done := make(chan struct{})
	p.listing = done
	p.mu.Unlock()
	at := p.now()
	claims, err := p.pendingClaims(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.listing = nil
	close(done)
	if err != nil {
		return nil, err
	}
	p.current = &claimList{at: at, claims: claims, handles: map[pendingClaim]string{}}
	return p.current, nil
}

// pendingClaims lists the claims that wait on a node for a data source.
func (p *Pending) pendingClaims(ctx context.Context) ([]pendingClaim, error) {
	// ResourceVersion "0": from the API server's cache, not etcd.
	pvcs, err := p.Client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, err
	}
	var out []pendingClaim
	for i := range pvcs.Items {
		pvc := &pvcs.Items[i]
		node := pvc.Annotations[SelectedNodeAnnotation]
		if pvc.Status.Phase != corev1.ClaimPending || pvc.DeletionTimestamp != nil || node == "" {
			continue
		}
		if c, ok := p.sourceOf(pvc); ok {
			c.node = node
			out = append(out, c)
		}
	}
	return out, nil
}

// sourceOf is the data source a claim names (dataSourceRef, which may name
// another namespace, else dataSource), if it is one this driver serves.
func (p *Pending) sourceOf(pvc *corev1.PersistentVolumeClaim) (pendingClaim, bool) {
	var group, kind, name, ns string
	switch {
	case pvc.Spec.DataSourceRef != nil:
		r := pvc.Spec.DataSourceRef
		kind, name, ns = r.Kind, r.Name, pvc.Namespace
		if r.APIGroup != nil {
			group = *r.APIGroup
		}
		if r.Namespace != nil && *r.Namespace != "" {
			ns = *r.Namespace
		}
	case pvc.Spec.DataSource != nil:
		r := pvc.Spec.DataSource
		kind, name, ns = r.Kind, r.Name, pvc.Namespace
		if r.APIGroup != nil {
			group = *r.APIGroup
		}
	default:
		return pendingClaim{}, false
	}
	switch {
	case group == "snapshot.storage.k8s.io" && kind == "VolumeSnapshot":
		return pendingClaim{kind: p.SnapshotKind, namespace: ns, name: name}, true
	case group == "" && kind == "PersistentVolumeClaim":
		return pendingClaim{kind: p.VolumeKind, namespace: ns, name: name}, true
	}
	return pendingClaim{}, false
}

// handleOf is the CSI handle of a claim's data source: the snapshot
// handle of the VolumeSnapshot's bound content, or the volume handle of
// the source claim's volume; "" when it is not (yet) this driver's.
func (p *Pending) handleOf(ctx context.Context, c pendingClaim) (string, error) {
	if c.kind == p.SnapshotKind {
		vs, err := p.Snapshots.SnapshotV1().VolumeSnapshots(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
		if err != nil {
			return "", ignoreNotFound(err)
		}
		if vs.Status == nil || vs.Status.BoundVolumeSnapshotContentName == nil {
			return "", nil
		}
		vsc, err := p.Snapshots.SnapshotV1().VolumeSnapshotContents().Get(ctx, *vs.Status.BoundVolumeSnapshotContentName, metav1.GetOptions{})
		if err != nil {
			return "", ignoreNotFound(err)
		}
		// The content must be bound to that snapshot both ways: a content
		// made by hand cannot claim a snapshot it was not bound to.
		if vsc.Spec.Driver != p.Driver || vsc.Spec.VolumeSnapshotRef.Namespace != c.namespace || vsc.Spec.VolumeSnapshotRef.Name != c.name {
			return "", nil
		}
		if vsc.Status != nil && vsc.Status.SnapshotHandle != nil {
			return *vsc.Status.SnapshotHandle, nil
		}
		if vsc.Spec.Source.SnapshotHandle != nil {
			return *vsc.Spec.Source.SnapshotHandle, nil
		}
		return "", nil
	}
	src, err := p.Client.CoreV1().PersistentVolumeClaims(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
	if err != nil {
		return "", ignoreNotFound(err)
	}
	if src.Spec.VolumeName == "" {
		return "", nil
	}
	pv, err := p.Client.CoreV1().PersistentVolumes().Get(ctx, src.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", ignoreNotFound(err)
	}
	// The volume must be bound to that claim: a volume made by hand
	// cannot claim a claim it is not bound to.
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != p.Driver || pv.Spec.ClaimRef == nil ||
		pv.Spec.ClaimRef.Namespace != c.namespace || pv.Spec.ClaimRef.Name != c.name || pv.Spec.ClaimRef.UID != src.UID {
		return "", nil
	}
	return pv.Spec.CSI.VolumeHandle, nil
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
