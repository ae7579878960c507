// Package kubefake fills kube.Interface from clientsets, for tests: the
// typed clients of client-go's and external-snapshotter's fake clientsets
// (with their object trackers and reactors). Only tests import it, so the
// driver's binary links neither clientset.
package kubefake

import (
	"context"
	"strings"

	groupv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumegroupsnapshot/v1"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/hostpath-csi/hostpath/kube"
)

// API is kube.Interface over a clientset and a snapshot clientset; either
// may be nil when the test uses none of its resources.
type API struct {
	Core      kubernetes.Interface
	Snapshots versioned.Interface
}

var _ kube.Interface = API{}

// New is the API over core and snapshots.
func New(core kubernetes.Interface, snapshots versioned.Interface) API {
	return API{Core: core, Snapshots: snapshots}
}

// IsWatchListSemanticsUnSupported tells informers (kube.Informer) that
// the fakes cannot stream a first list: they list, then watch.
func (API) IsWatchListSemanticsUnSupported() bool { return true }

// Nodes implements kube.Interface.
func (a API) Nodes() kube.Resource[*corev1.Node, *corev1.NodeList] { return a.Core.CoreV1().Nodes() }

// PersistentVolumes implements kube.Interface.
func (a API) PersistentVolumes() kube.Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return a.Core.CoreV1().PersistentVolumes()
}

// PersistentVolumeClaims implements kube.Interface.
func (a API) PersistentVolumeClaims(ns string) kube.Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return a.Core.CoreV1().PersistentVolumeClaims(ns)
}

// Pods implements kube.Interface.
func (a API) Pods(ns string) kube.Resource[*corev1.Pod, *corev1.PodList] {
	return a.Core.CoreV1().Pods(ns)
}

// Events implements kube.Interface.
func (a API) Events(ns string) kube.Resource[*corev1.Event, *corev1.EventList] {
	return a.Core.CoreV1().Events(ns)
}

// Secrets implements kube.Interface.
func (a API) Secrets(ns string) kube.Resource[*corev1.Secret, *corev1.SecretList] {
	return a.Core.CoreV1().Secrets(ns)
}

// ConfigMaps implements kube.Interface.
func (a API) ConfigMaps(ns string) kube.Resource[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return a.Core.CoreV1().ConfigMaps(ns)
}

// ReplicaSets implements kube.Interface.
func (a API) ReplicaSets(ns string) kube.Resource[*appsv1.ReplicaSet, *appsv1.ReplicaSetList] {
	return a.Core.AppsV1().ReplicaSets(ns)
}

// CSIDrivers implements kube.Interface.
func (a API) CSIDrivers() kube.Resource[*storagev1.CSIDriver, *storagev1.CSIDriverList] {
	return a.Core.StorageV1().CSIDrivers()
}

// CSINodes implements kube.Interface.
func (a API) CSINodes() kube.Resource[*storagev1.CSINode, *storagev1.CSINodeList] {
	return a.Core.StorageV1().CSINodes()
}

// CertificateSigningRequests implements kube.Interface.
func (a API) CertificateSigningRequests() kube.CSRs {
	return a.Core.CertificatesV1().CertificateSigningRequests()
}

// TokenReviews implements kube.Interface.
func (a API) TokenReviews() kube.Creator[*authnv1.TokenReview] {
	return a.Core.AuthenticationV1().TokenReviews()
}

// SubjectAccessReviews implements kube.Interface.
func (a API) SubjectAccessReviews() kube.Creator[*authzv1.SubjectAccessReview] {
	return a.Core.AuthorizationV1().SubjectAccessReviews()
}

// VolumeSnapshots implements kube.Interface.
func (a API) VolumeSnapshots(ns string) kube.Resource[*snapv1.VolumeSnapshot, *snapv1.VolumeSnapshotList] {
	return a.Snapshots.SnapshotV1().VolumeSnapshots(ns)
}

// VolumeSnapshotContents implements kube.Interface.
func (a API) VolumeSnapshotContents() kube.Resource[*snapv1.VolumeSnapshotContent, *snapv1.VolumeSnapshotContentList] {
	return a.Snapshots.SnapshotV1().VolumeSnapshotContents()
}

// VolumeGroupSnapshots implements kube.Interface.
func (a API) VolumeGroupSnapshots(ns string) kube.Resource[*groupv1.VolumeGroupSnapshot, *groupv1.VolumeGroupSnapshotList] {
	return a.Snapshots.GroupsnapshotV1().VolumeGroupSnapshots(ns)
}

// Served implements kube.Interface: the fake's discovery lists the group
// version of path (/apis/GROUP/VERSION).
func (a API) Served(_ context.Context, path string) error {
	_, err := a.Core.Discovery().ServerResourcesForGroupVersion(groupVersion(path))
	return err
}

func groupVersion(path string) string {
	gv, _ := strings.CutPrefix(path, "/apis/")
	return gv
}
