// Package lostnodes tells the pods that wait for a node-local volume whose
// node has left the cluster why they wait. The scheduler's own event says
// only that no node matched the PersistentVolume's node affinity; a person
// looking at a Pending pod wants the node's name and what to do. Every
// scan it finds the driver's bound PersistentVolumes whose node (the value
// of the topology key in their node affinity) no Node carries any more,
// and puts a Warning event naming that node on each unscheduled pod that
// uses one and on its claim (a Node by that name that lacks the key is
// not gone: its events say the driver is not running there). An event it
// cannot write is reported, and the scan goes on.
//
// It knows nothing of CSI beyond a driver name and a topology key. One
// driver of the deployment reports (the one on the first node, by name,
// that carries the topology key), so the events are not repeated per node.
// It needs to list Nodes, PersistentVolumes and Pods and to create and
// update Events, which the node's sidecars need already.
package lostnodes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/kube"
)

// Reason is the reason of the events it puts for a node that is gone;
// ReasonNoDriver of those for a node that is in the cluster but does not
// carry the topology key (the driver is not registered there: its pod is
// not running, or is starting), whose data is there all the same.
const (
	Reason         = "VolumeNodeGone"
	ReasonNoDriver = "VolumeNodeWithoutDriver"
)

// Watcher scans for pods waiting for a node that is gone.
type Watcher struct {
	Client      kube.Interface
	Driver      string // the CSI driver name of the PersistentVolumes
	TopologyKey string // the node label and PV node-affinity key naming a node
	Self        string // this node's value of TopologyKey
	Now         func() time.Time
}

// Lost is one pod or claim told about a volume whose node is gone, or
// without the driver.
type Lost struct {
	Object corev1.ObjectReference
	Volume string // the PersistentVolume
	Node   string // its node, by the topology key's value
	Reason string // Reason or ReasonNoDriver
}

// Run scans every interval until ctx ends; report gets what each scan
// told and its error.
func (w *Watcher) Run(ctx context.Context, every time.Duration, report func([]Lost, error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if told, err := w.Scan(ctx); ctx.Err() == nil && (err != nil || len(told) > 0) {
			report(told, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scan puts an event on every unscheduled pod, and its claim, that uses a
// volume of the driver whose node is gone, and returns what it told. On a
// driver that is not the reporting one it does nothing.
func (w *Watcher) Scan(ctx context.Context) ([]Lost, error) {
	nodes, err := w.Client.Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	alive := map[string]bool{}
	named := map[string]bool{} // every Node, by name: one without the key is not gone
	var first, reporter string // the first node by name carrying the key, and its value
	for _, n := range nodes.Items {
		named[n.Name] = true
		if v, ok := n.Labels[w.TopologyKey]; ok {
			alive[v] = true
			if first == "" || n.Name < first {
				first, reporter = n.Name, v
			}
		}
	}
	if first == "" || reporter != w.Self {
		return nil, nil
	}
	pvs, err := w.Client.PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing persistent volumes: %w", err)
	}
	type gone struct {
		pv, node string
		there    bool // a Node by that name is in the cluster, without the key
	}
	claims := map[string]gone{} // namespace/name
	var claimRefs []corev1.ObjectReference
	for _, pv := range pvs.Items {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != w.Driver || pv.Spec.ClaimRef == nil || pv.Status.Phase != corev1.VolumeBound {
			continue
		}
		node := w.nodeOf(&pv)
		if node == "" || alive[node] {
			continue
		}
		ref := *pv.Spec.ClaimRef
		claims[ref.Namespace+"/"+ref.Name] = gone{pv.Name, node, named[node]}
		claimRefs = append(claimRefs, corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID})
	}
	if len(claims) == 0 {
		return nil, nil
	}
	pods, err := w.Client.Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Pending,spec.nodeName="})
	if err != nil {
		return nil, fmt.Errorf("listing pending pods: %w", err)
	}
	var told []Lost
	var errs []error             // events that could not be written: the scan goes on
	waiting := map[string]bool{} // claims some pod waits for
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			key := p.Namespace + "/" + v.PersistentVolumeClaim.ClaimName
			g, ok := claims[key]
			if !ok {
				continue
			}
			waiting[key] = true
			ref := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID}
			reason, msg := Reason, fmt.Sprintf("waits for node %s, which is no longer in the cluster: its volume %s (claim %s) lives on that node's disk only. The pod stays Pending until %s comes back; to give up the data, delete the claim (and the pod, if a controller does not make a new claim)",
				g.node, g.pv, v.PersistentVolumeClaim.ClaimName, g.node)
			if g.there {
				reason, msg = ReasonNoDriver, fmt.Sprintf("waits for node %s, which is in the cluster but does not offer driver %s (its driver pod is not running or not registered there): its volume %s (claim %s) lives on that node's disk. The pod stays Pending until the driver runs on %s again",
					g.node, w.Driver, g.pv, v.PersistentVolumeClaim.ClaimName, g.node)
			}
			if err := w.event(ctx, ref, g.node, reason, msg); err != nil {
				errs = append(errs, err)
				continue
			}
			told = append(told, Lost{Object: ref, Volume: g.pv, Node: g.node, Reason: reason})
		}
	}
	for _, ref := range claimRefs {
		key := ref.Namespace + "/" + ref.Name
		if !waiting[key] {
			continue
		}
		g := claims[key]
		reason, msg := Reason, fmt.Sprintf("is bound to volume %s on node %s, which is no longer in the cluster: pods using this claim stay Pending until %s comes back with its disk", g.pv, g.node, g.node)
		if g.there {
			reason, msg = ReasonNoDriver, fmt.Sprintf("is bound to volume %s on node %s, which is in the cluster but does not offer driver %s: pods using this claim stay Pending until the driver runs there again", g.pv, g.node, w.Driver)
		}
		if err := w.event(ctx, ref, g.node, reason, msg); err != nil {
			errs = append(errs, err)
			continue
		}
		told = append(told, Lost{Object: ref, Volume: g.pv, Node: g.node, Reason: reason})
	}
	return told, errors.Join(errs...)
}

// nodeOf is the node a PV's required node affinity names by the key.
func (w *Watcher) nodeOf(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == w.TopologyKey && e.Operator == corev1.NodeSelectorOpIn && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// event creates the Warning event for (object, node), or counts one more
// of it: one event per pair, named after it, as the kubelet's event
// aggregation would leave it.
func (w *Watcher) event(ctx context.Context, ref corev1.ObjectReference, node, reason, msg string) error {
	now := metav1.NewTime(time.Now())
	if w.Now != nil {
		now = metav1.NewTime(w.Now())
	}
	sum := sha256.Sum256([]byte(string(ref.UID) + "/" + ref.Kind + "/" + ref.Name + "/" + node))
	name := ref.Name + "." + hex.EncodeToString(sum[:8])
	events := w.Client.Events(ref.Namespace)
	ev, err := events.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = events.Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: ref.Namespace},
			InvolvedObject: ref, Reason: reason, Message: msg, Type: corev1.EventTypeWarning,
			Source:         corev1.EventSource{Component: w.Driver, Host: w.Self},
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
			ReportingController: w.Driver, ReportingInstance: w.Self,
		}, metav1.CreateOptions{})
	case err == nil:
		ev.Count++
		ev.LastTimestamp, ev.Message = now, msg
		_, err = events.Update(ctx, ev, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("event on %s %s/%s: %w", ref.Kind, ref.Namespace, ref.Name, err)
	}
	return nil
}
