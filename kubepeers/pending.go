package kubepeers

import (
	"context"
	"fmt"
	"sync"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/kube"
	"github.com/hostpath-csi/hostpath/transfer"
)

// SelectedNodeAnnotation is where the scheduler writes the node a
// WaitForFirstConsumer claim is to be provisioned on; a node-deployed
// provisioner takes only the claims selected for its node.
const SelectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// ManagedByLabel is the label the snapshot-controller (with distributed
// snapshotting) puts on a VolumeSnapshotContent to name the node whose
// snapshotter handles it; snapimport puts it on pre-provisioned ones.
const ManagedByLabel = "snapshot.storage.kubernetes.io/managed-by"

// Owner is what the serving node recorded about one of its sources when it
// made it: the VolumeSnapshot (namespace, name) a snapshot was made for
// and its VolumeSnapshotContent (Object), or the claim a volume was made
// for and its PersistentVolume (Object).
type Owner struct {
	Namespace, Name, Object string
	// Group: the owner is a VolumeGroupSnapshot (Name) and its content
	// (Object), and the source one member of it.
	Group bool
	// Source is, for a snapshot, the handle of the volume it was made of.
	Source string
}

// Pending is the transfer's Authorizer for the CSI driver: a node may have
// a source (a snapshot, a volume) only while a claim that restores or
// clones it waits to be provisioned on that node: Pending, selected for
// that node by the scheduler, its data source the object the serving
// node's own record says the source was made for:
//
//   - a snapshot: the VolumeSnapshot named in the record, whose
//     status.boundVolumeSnapshotContentName (written by the
//     snapshot-controller alone) is the content named in the record;
//   - a volume: the claim named in the record, whose spec.volumeName is
//     the PersistentVolume named in the record.
//
// A source recorded without its owner (made through the CSI API alone, a
// group's member, or before owners were kept), or a snapshot restored
// through a pre-provisioned content, is served only through API objects
// that this node alone may write under the driver's admission policies:
// a content labelled managed-by this node, or a PersistentVolume whose
// node affinity is this node. A source in another namespace than the
// claim's is served only where a ReferenceGrant in the source's namespace
// lets that claim's namespace have it, as the provisioner requires.
//
// The claims are listed at most every MaxAge (from the API server's watch
// cache), however many requests come; the data sources of the claims
// selected for the asking node are looked up as asked, once per list.
type Pending struct {
	Client kube.Interface
	Driver string
	// Node is this node's name; TopologyKey the node-affinity key of the
	// driver's volumes.
	Node, TopologyKey string
	// Owners is this node's record of a source: whether it is here and
	// ready, and its owner (ok false when none was recorded).
	Owners func(kind, id string) (owner Owner, here, ok bool)
	// Grants reports whether a ReferenceGrant lets claims in namespace
	// from have the source group/kind/name in namespace ns; nil refuses
	// every source in another namespace.
	Grants func(ctx context.Context, from, ns, group, kind, name string) (bool, error)
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

// claimList is one list of the pending claims, with the decisions made
// while it is current.
type claimList struct {
	at        time.Time
	claims    []pendingClaim
	decisions map[decision]bool
}

// pendingClaim is a claim's wait: the node it is selected for, its
// namespace, and the source it is to be filled from (kind, namespace/name
// of the VolumeSnapshot or claim, and the API group for a grant).
type pendingClaim struct {
	node, claimNS, kind, group, srcKind, namespace, name string
}

// decision is one claim's answer for one source.
type decision struct {
	c  pendingClaim
	id string
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
	owner, here, known := p.Owners(kind, id)
	if !here {
		return fmt.Errorf("%w: no ready %s %s on this node", transfer.ErrRefused, kind, id)
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
		key := decision{c, id}
		p.mu.Lock()
		ok, decided := list.decisions[key]
		p.mu.Unlock()
		if !decided {
			if ok, err = p.allows(ctx, c, id, owner, known); err != nil {
				lookupErr = err
				continue
			}
			p.mu.Lock()
			list.decisions[key] = ok
			p.mu.Unlock()
		}
		if ok {
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
	p.current = &claimList{at: at, claims: claims, decisions: map[decision]bool{}}
	return p.current, nil
}

// pendingClaims lists the claims that wait on a node for a data source.
func (p *Pending) pendingClaims(ctx context.Context) ([]pendingClaim, error) {
	// ResourceVersion "0": from the API server's cache, not etcd.
	pvcs, err := p.Client.PersistentVolumeClaims("").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
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
			c.node, c.claimNS = node, pvc.Namespace
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
		return pendingClaim{kind: p.SnapshotKind, group: group, srcKind: kind, namespace: ns, name: name}, true
	case group == "" && kind == "PersistentVolumeClaim":
		return pendingClaim{kind: p.VolumeKind, group: group, srcKind: kind, namespace: ns, name: name}, true
	}
	return pendingClaim{}, false
}

// allows decides whether claim c may be filled from the source id,
// whose owner this node recorded (known) or not.
func (p *Pending) allows(ctx context.Context, c pendingClaim, id string, owner Owner, known bool) (bool, error) {
	if c.namespace != c.claimNS {
		if p.Grants == nil {
			return false, nil
		}
		if ok, err := p.Grants(ctx, c.claimNS, c.namespace, c.group, c.srcKind, c.name); err != nil || !ok {
			return false, err
		}
	}
	if c.kind == p.SnapshotKind {
		return p.allowsSnapshot(ctx, c, id, owner, known)
	}
	return p.allowsVolume(ctx, c, id, owner, known)
}

// allowsSnapshot: the claim restores the VolumeSnapshot the record names,
// bound to the recorded content; else (no owner recorded: a group
// snapshot's member, a pre-provisioned content, a snapshot of an older
// release) a content of this driver bound both ways to the claim's
// VolumeSnapshot, whose handle is id: in its spec, or in its status where
// it is labelled managed-by this node.
func (p *Pending) allowsSnapshot(ctx context.Context, c pendingClaim, id string, owner Owner, known bool) (bool, error) {
	vs, err := p.Client.VolumeSnapshots(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	if vs.DeletionTimestamp != nil || vs.Status == nil || vs.Status.BoundVolumeSnapshotContentName == nil {
		return false, nil
	}
	bound := *vs.Status.BoundVolumeSnapshotContentName
	if known && !owner.Group && owner.Namespace == c.namespace && owner.Name == c.name && owner.Object == bound {
		return p.contentOf(ctx, bound, c, owner.Source)
	}
	if known && owner.Group {
		return p.allowsMember(ctx, c, vs, id, owner)
	}
	vsc, err := p.Client.VolumeSnapshotContents().Get(ctx, bound, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	// The content must be bound to that snapshot both ways (a content made
	// by hand cannot claim a snapshot it was not bound to), and be this
	// node's: only this node's account may write a content labelled so.
	// Or its handle is in its spec: such a content is made by the
	// snapshot-controller (a group snapshot's member, whose snapshot this
	// node made knowing only the group's name) or by a cluster admin (a
	// pre-provisioned one); no node may make a content or change a spec.
	if p.Node == "" || vsc.Spec.Driver != p.Driver ||
		vsc.Spec.VolumeSnapshotRef.Namespace != c.namespace || vsc.Spec.VolumeSnapshotRef.Name != c.name {
		return false, nil
	}
	if vsc.Labels[ManagedByLabel] != p.Node && vsc.Spec.Source.SnapshotHandle == nil {
		return false, nil
	}
	if vsc.Spec.Source.SnapshotHandle != nil {
		return *vsc.Spec.Source.SnapshotHandle == id, nil
	}
	return vsc.Status != nil && vsc.Status.SnapshotHandle != nil && *vsc.Status.SnapshotHandle == id, nil
}

// contentOf: the recorded owner is trusted only as far as the content it
// names says the same. The owner comes from CreateSnapshot's parameters,
// and whoever holds the controller's certificate can call a node's
// CreateSnapshot with any: naming its own VolumeSnapshot as the owner of
// a snapshot of someone else's volume would let it restore that volume
// anywhere. So the content must be one the snapshot-controller made for
// that VolumeSnapshot (the reference back) of a volume of this driver
// whose handle is the volume the snapshot was made of; no node may make a
// content or change its spec, and a claim's snapshot in another namespace
// cannot source a volume it cannot see.
func (p *Pending) contentOf(ctx context.Context, name string, c pendingClaim, source string) (bool, error) {
	vsc, err := p.Client.VolumeSnapshotContents().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	return source != "" && vsc.Spec.Driver == p.Driver &&
		vsc.Spec.VolumeSnapshotRef.Namespace == c.namespace && vsc.Spec.VolumeSnapshotRef.Name == c.name &&
		vsc.Spec.Source.VolumeHandle != nil && *vsc.Spec.Source.VolumeHandle == source, nil
}

// allowsMember: the source is a member of the VolumeGroupSnapshot the
// record names; the claim restores a VolumeSnapshot the snapshot-controller
// made for a member of that group (it names the group in its status), the
// group is bound to the recorded group content, and the claim's snapshot
// is bound both ways to a content of this driver whose handle is id.
// Neither the group's content nor a content's status can be written by a
// node.
func (p *Pending) allowsMember(ctx context.Context, c pendingClaim, vs *snapv1.VolumeSnapshot, id string, owner Owner) (bool, error) {
	if owner.Namespace != c.namespace || vs.Status.VolumeGroupSnapshotName == nil || *vs.Status.VolumeGroupSnapshotName != owner.Name {
		return false, nil
	}
	g, err := p.Client.VolumeGroupSnapshots(owner.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	if g.DeletionTimestamp != nil || g.Status == nil || g.Status.BoundVolumeGroupSnapshotContentName == nil || *g.Status.BoundVolumeGroupSnapshotContentName != owner.Object {
		return false, nil
	}
	vsc, err := p.Client.VolumeSnapshotContents().Get(ctx, *vs.Status.BoundVolumeSnapshotContentName, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	if vsc.Spec.Driver != p.Driver || vsc.Spec.VolumeSnapshotRef.Namespace != c.namespace || vsc.Spec.VolumeSnapshotRef.Name != c.name {
		return false, nil
	}
	if vsc.Spec.Source.SnapshotHandle != nil {
		return *vsc.Spec.Source.SnapshotHandle == id, nil
	}
	return vsc.Status != nil && vsc.Status.SnapshotHandle != nil && *vsc.Status.SnapshotHandle == id, nil
}

// allowsVolume: the claim clones the claim the record names, bound to the
// recorded PersistentVolume; else (no owner recorded) a PersistentVolume
// of this driver with handle id, bound to the source claim (its UID too),
// whose node affinity is this node.
func (p *Pending) allowsVolume(ctx context.Context, c pendingClaim, id string, owner Owner, known bool) (bool, error) {
	src, err := p.Client.PersistentVolumeClaims(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	if src.DeletionTimestamp != nil || src.Spec.VolumeName == "" {
		return false, nil
	}
	if known {
		return owner.Namespace == c.namespace && owner.Name == c.name && owner.Object == src.Spec.VolumeName, nil
	}
	pv, err := p.Client.PersistentVolumes().Get(ctx, src.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return false, ignoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != p.Driver || pv.Spec.CSI.VolumeHandle != id || pv.Spec.ClaimRef == nil ||
		pv.Spec.ClaimRef.Namespace != c.namespace || pv.Spec.ClaimRef.Name != c.name || pv.Spec.ClaimRef.UID != src.UID {
		return false, nil
	}
	return p.Node != "" && onlyOn(pv, p.TopologyKey, p.Node), nil
}

// onlyOn reports whether a PersistentVolume's node affinity admits node
// alone, by key.
func onlyOn(pv *corev1.PersistentVolume, key, node string) bool {
	a := pv.Spec.NodeAffinity
	if a == nil || a.Required == nil || len(a.Required.NodeSelectorTerms) == 0 {
		return false
	}
	for _, t := range a.Required.NodeSelectorTerms {
		pinned := false
		for _, e := range t.MatchExpressions {
			if e.Key == key && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 && e.Values[0] == node {
				pinned = true
			}
		}
		if !pinned {
			return false
		}
	}
	return true
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
