package kube

import (
	"context"
	"fmt"

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
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// scheme holds the driver's API groups only (client-go's global scheme
// holds every group, and linking it links them all).
var (
	scheme = func() *runtime.Scheme {
		s := runtime.NewScheme()
		for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme,
			storagev1.AddToScheme, certv1.AddToScheme, authnv1.AddToScheme, authzv1.AddToScheme,
			snapv1.AddToScheme, groupv1.AddToScheme} {
			if err := add(s); err != nil {
				panic(err) // a registration conflict among fixed types: a build defect
			}
		}
		// The options types (ListOptions, ...) as every version takes them.
		metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
		return s
	}()
	codecs = serializer.NewCodecFactory(scheme)
	params = runtime.NewParameterCodec(scheme)
)

// Client is the API server's Interface: one REST client per API group
// version, sharing one connection pool, as a clientset's do.
type Client struct {
	core, apps, storage, certs, authn, authz, snaps, groups rest.Interface
}

var _ Interface = (*Client)(nil) // and so each client is a Resource

// NewForConfig is a Client for cfg.
func NewForConfig(cfg *rest.Config) (*Client, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	// As a clientset: a QPS set is one limit shared by every group;
	// none leaves each group's client its own default (5 a second, bursts
	// of 10), as the driver had with the clientsets.
	if c.RateLimiter == nil && c.QPS > 0 {
		burst := c.Burst
		if burst <= 0 {
			burst = rest.DefaultBurst
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, burst)
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, err
	}
	rc := func(gv schema.GroupVersion) (rest.Interface, error) {
		g := c
		g.GroupVersion = &gv
		g.APIPath = "/apis"
		if gv.Group == "" {
			g.APIPath = "/api"
		}
		g.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(scheme, codecs).WithoutConversion()
		r, err := rest.RESTClientForConfigAndClient(&g, httpClient)
		if err != nil {
			return nil, fmt.Errorf("a client for %s: %w", gv, err)
		}
		return r, nil
	}
	var k Client
	for _, p := range []struct {
		to *rest.Interface
		gv schema.GroupVersion
	}{{&k.core, corev1.SchemeGroupVersion}, {&k.apps, appsv1.SchemeGroupVersion},
		{&k.storage, storagev1.SchemeGroupVersion}, {&k.certs, certv1.SchemeGroupVersion},
		{&k.authn, authnv1.SchemeGroupVersion}, {&k.authz, authzv1.SchemeGroupVersion},
		{&k.snaps, snapv1.SchemeGroupVersion}, {&k.groups, groupv1.SchemeGroupVersion}} {
		if *p.to, err = rc(p.gv); err != nil {
			return nil, err
		}
	}
	return &k, nil
}

// resource is the client of a built-in resource.
func resource[T object, L runtime.Object](c rest.Interface, name, namespace string, newT func() T, newL func() L) *resourceClient[T, L] {
	return &resourceClient[T, L]{rc: c, resource: name, namespace: namespace, newT: newT, newL: newL, proto: true}
}

// custom is the client of a custom resource.
func custom[T object, L runtime.Object](c rest.Interface, name, namespace string, newT func() T, newL func() L) *resourceClient[T, L] {
	return &resourceClient[T, L]{rc: c, resource: name, namespace: namespace, newT: newT, newL: newL}
}

// Nodes implements Interface.
func (k *Client) Nodes() Resource[*corev1.Node, *corev1.NodeList] {
	return resource(k.core, "nodes", "", func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

// PersistentVolumes implements Interface.
func (k *Client) PersistentVolumes() Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return resource(k.core, "persistentvolumes", "", func() *corev1.PersistentVolume { return &corev1.PersistentVolume{} },
		func() *corev1.PersistentVolumeList { return &corev1.PersistentVolumeList{} })
}

// PersistentVolumeClaims implements Interface.
func (k *Client) PersistentVolumeClaims(namespace string) Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return resource(k.core, "persistentvolumeclaims", namespace, func() *corev1.PersistentVolumeClaim { return &corev1.PersistentVolumeClaim{} },
		func() *corev1.PersistentVolumeClaimList { return &corev1.PersistentVolumeClaimList{} })
}

// Pods implements Interface.
func (k *Client) Pods(namespace string) Resource[*corev1.Pod, *corev1.PodList] {
	return resource(k.core, "pods", namespace, func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

// Events implements Interface.
func (k *Client) Events(namespace string) Resource[*corev1.Event, *corev1.EventList] {
	return resource(k.core, "events", namespace, func() *corev1.Event { return &corev1.Event{} }, func() *corev1.EventList { return &corev1.EventList{} })
}

// Secrets implements Interface.
func (k *Client) Secrets(namespace string) Resource[*corev1.Secret, *corev1.SecretList] {
	return resource(k.core, "secrets", namespace, func() *corev1.Secret { return &corev1.Secret{} }, func() *corev1.SecretList { return &corev1.SecretList{} })
}

// ConfigMaps implements Interface.
func (k *Client) ConfigMaps(namespace string) Resource[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return resource(k.core, "configmaps", namespace, func() *corev1.ConfigMap { return &corev1.ConfigMap{} },
		func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
}

// ReplicaSets implements Interface.
func (k *Client) ReplicaSets(namespace string) Resource[*appsv1.ReplicaSet, *appsv1.ReplicaSetList] {
	return resource(k.apps, "replicasets", namespace, func() *appsv1.ReplicaSet { return &appsv1.ReplicaSet{} },
		func() *appsv1.ReplicaSetList { return &appsv1.ReplicaSetList{} })
}

// CSIDrivers implements Interface.
func (k *Client) CSIDrivers() Resource[*storagev1.CSIDriver, *storagev1.CSIDriverList] {
	return resource(k.storage, "csidrivers", "", func() *storagev1.CSIDriver { return &storagev1.CSIDriver{} },
		func() *storagev1.CSIDriverList { return &storagev1.CSIDriverList{} })
}

// CSINodes implements Interface.
func (k *Client) CSINodes() Resource[*storagev1.CSINode, *storagev1.CSINodeList] {
	return resource(k.storage, "csinodes", "", func() *storagev1.CSINode { return &storagev1.CSINode{} },
		func() *storagev1.CSINodeList { return &storagev1.CSINodeList{} })
}

// csrs adds the approval subresource to the resource's client.
type csrs struct {
	*resourceClient[*certv1.CertificateSigningRequest, *certv1.CertificateSigningRequestList]
}

// UpdateApproval implements CSRs.
func (c csrs) UpdateApproval(ctx context.Context, name string, csr *certv1.CertificateSigningRequest, opts metav1.UpdateOptions) (*certv1.CertificateSigningRequest, error) {
	out := &certv1.CertificateSigningRequest{}
	err := c.request(c.rc.Put()).Name(name).SubResource("approval").VersionedParams(&opts, params).Body(csr).Do(ctx).Into(out)
	return out, err
}

// CertificateSigningRequests implements Interface.
func (k *Client) CertificateSigningRequests() CSRs {
	return csrs{resource(k.certs, "certificatesigningrequests", "", func() *certv1.CertificateSigningRequest { return &certv1.CertificateSigningRequest{} },
		func() *certv1.CertificateSigningRequestList { return &certv1.CertificateSigningRequestList{} })}
}

// TokenReviews implements Interface.
func (k *Client) TokenReviews() Creator[*authnv1.TokenReview] {
	return creator[*authnv1.TokenReview]{k.authn, "tokenreviews", func() *authnv1.TokenReview { return &authnv1.TokenReview{} }}
}

// SubjectAccessReviews implements Interface.
func (k *Client) SubjectAccessReviews() Creator[*authzv1.SubjectAccessReview] {
	return creator[*authzv1.SubjectAccessReview]{k.authz, "subjectaccessreviews", func() *authzv1.SubjectAccessReview { return &authzv1.SubjectAccessReview{} }}
}

// VolumeSnapshots implements Interface.
func (k *Client) VolumeSnapshots(namespace string) Resource[*snapv1.VolumeSnapshot, *snapv1.VolumeSnapshotList] {
	return custom(k.snaps, "volumesnapshots", namespace, func() *snapv1.VolumeSnapshot { return &snapv1.VolumeSnapshot{} },
		func() *snapv1.VolumeSnapshotList { return &snapv1.VolumeSnapshotList{} })
}

// VolumeSnapshotContents implements Interface.
func (k *Client) VolumeSnapshotContents() Resource[*snapv1.VolumeSnapshotContent, *snapv1.VolumeSnapshotContentList] {
	return custom(k.snaps, "volumesnapshotcontents", "", func() *snapv1.VolumeSnapshotContent { return &snapv1.VolumeSnapshotContent{} },
		func() *snapv1.VolumeSnapshotContentList { return &snapv1.VolumeSnapshotContentList{} })
}

// VolumeGroupSnapshots implements Interface.
func (k *Client) VolumeGroupSnapshots(namespace string) Resource[*groupv1.VolumeGroupSnapshot, *groupv1.VolumeGroupSnapshotList] {
	return custom(k.groups, "volumegroupsnapshots", namespace, func() *groupv1.VolumeGroupSnapshot { return &groupv1.VolumeGroupSnapshot{} },
		func() *groupv1.VolumeGroupSnapshotList { return &groupv1.VolumeGroupSnapshotList{} })
}

// Served implements Interface.
func (k *Client) Served(ctx context.Context, path string) error {
	return k.core.Get().AbsPath(path).Do(ctx).Error()
}
