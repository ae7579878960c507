// Package kube is the Kubernetes API as the driver uses it: the dozen
// resources it reads and writes, each a narrow typed client.
//
// It exists for the binary's size and build time. client-go's clientset
// (kubernetes.Interface), its informer factories and external-snapshotter's
// clientset each link the client, informer, lister and apply configuration of
// every API group through client-go's global scheme (56 groups, two thirds of
// the driver's code); the driver uses eight. Client is a REST client per
// group over a scheme of only those groups, and Interface
// is satisfied as well by the typed clients of a clientset, which is how the
// tests hand in client-go's fakes (package kubefake).
package kube

import (
	"context"

	groupv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumegroupsnapshot/v1"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// Resource is a typed client of one resource (in one namespace, for a
// namespaced one): Client's and a clientset's typed clients have these
// methods (a status, where one is used, is the
// resource's own interface's).
type Resource[T, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
}

// Creator is a client of a resource that is only created (a review).
type Creator[T runtime.Object] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
}

// CSRs is the client of CertificateSigningRequests: a Resource, and the
// status, where a signer puts the certificate, and the approval
// subresource, by which it approves or denies.
type CSRs interface {
	Resource[*certv1.CertificateSigningRequest, *certv1.CertificateSigningRequestList]
	UpdateStatus(ctx context.Context, csr *certv1.CertificateSigningRequest, opts metav1.UpdateOptions) (*certv1.CertificateSigningRequest, error)
	UpdateApproval(ctx context.Context, name string, csr *certv1.CertificateSigningRequest, opts metav1.UpdateOptions) (*certv1.CertificateSigningRequest, error)
}

// Interface is the API as the driver uses it. The method names are
// client-go's, so that a clientset's typed clients fill it in tests.
type Interface interface {
	Nodes() Resource[*corev1.Node, *corev1.NodeList]
	PersistentVolumes() Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList]
	PersistentVolumeClaims(namespace string) Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList]
	Pods(namespace string) Resource[*corev1.Pod, *corev1.PodList]
	Events(namespace string) Resource[*corev1.Event, *corev1.EventList]
	Secrets(namespace string) Resource[*corev1.Secret, *corev1.SecretList]
	ConfigMaps(namespace string) Resource[*corev1.ConfigMap, *corev1.ConfigMapList]
	ReplicaSets(namespace string) Resource[*appsv1.ReplicaSet, *appsv1.ReplicaSetList]
	CSIDrivers() Resource[*storagev1.CSIDriver, *storagev1.CSIDriverList]
	CSINodes() Resource[*storagev1.CSINode, *storagev1.CSINodeList]
	CertificateSigningRequests() CSRs
	TokenReviews() Creator[*authnv1.TokenReview]
	SubjectAccessReviews() Creator[*authzv1.SubjectAccessReview]
	VolumeSnapshots(namespace string) Resource[*snapv1.VolumeSnapshot, *snapv1.VolumeSnapshotList]
	VolumeSnapshotContents() Resource[*snapv1.VolumeSnapshotContent, *snapv1.VolumeSnapshotContentList]
	VolumeGroupSnapshots(namespace string) Resource[*groupv1.VolumeGroupSnapshot, *groupv1.VolumeGroupSnapshotList]
	// Served returns nil when the API server serves path (an API group
	// version's discovery document, /apis/GROUP/VERSION), else why not.
	Served(ctx context.Context, path string) error
}
