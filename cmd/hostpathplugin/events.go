package main

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/kube"
)

// volumeEvents makes the engine's notes about volumes (a file system
// staged smaller than its volume) Warning events on their
// PersistentVolumes, where `kubectl describe pv` shows them. Outside a
// cluster the notes are only logged.
func volumeEvents(d *csi.Driver, o options) {
	_, client, ok := inClusterClient("notes about volumes are only logged, not made events")
	if !ok {
		return
	}
	d.Engine().SetNotifier(func(pv, reason, msg string) {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := pvEvent(ctx, client, o.cfg.DriverName, o.cfg.NodeID, pv, reason, msg); err != nil {
				klog.ErrorS(err, "an event about a volume could not be made; the log has it", "pv", pv, "reason", reason)
			}
		}()
	})
}

// pvEvent creates a Warning event on PersistentVolume pv (events of
// cluster-scoped objects live in the default namespace), with its UID so
// kubectl describe finds it.
func pvEvent(ctx context.Context, client kube.Interface, driver, node, pv, reason, msg string) error {
	p, err := client.PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.NewTime(time.Now())
	_, err = client.Events(metav1.NamespaceDefault).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pv + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolume", APIVersion: "v1", Name: p.Name, UID: p.UID},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: driver, Host: node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: driver, ReportingInstance: node,
	}, metav1.CreateOptions{})
	return err
}
