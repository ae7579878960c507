package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// object is what the API serves: a runtime object with metadata.
type object interface {
	runtime.Object
	metav1.Object
}

// resourceClient is a Resource over a REST client. It is written here
// rather than taken from client-go's gentype because that package holds
// its fakes too, which link client-go's testing tracker and, through it,
// the OpenAPI models (about 2 MB of the binary).
type resourceClient[T object, L runtime.Object] struct {
	rc        rest.Interface
	resource  string
	namespace string
	newT      func() T
	newL      func() L
	// proto: the built-in types are asked for as protobuf, as client-go's
	// typed clients do; custom resources have JSON only.
	proto bool
}

func (c *resourceClient[T, L]) request(r *rest.Request) *rest.Request {
	return r.UseProtobufAsDefaultIfPreferred(c.proto).
		NamespaceIfScoped(c.namespace, c.namespace != "").Resource(c.resource)
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Get implements Resource.
func (c *resourceClient[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := c.newT()
	err := c.request(c.rc.Get()).Name(name).VersionedParams(&opts, params).Do(ctx).Into(out)
	return out, err
}

// List implements Resource.
func (c *resourceClient[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := c.newL()
	err := c.request(c.rc.Get()).VersionedParams(&opts, params).Timeout(timeout(opts)).Do(ctx).Into(out)
	return out, err
}

// Watch implements Resource.
func (c *resourceClient[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.request(c.rc.Get()).VersionedParams(&opts, params).Timeout(timeout(opts)).Watch(ctx)
}

// Create implements Resource.
func (c *resourceClient[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := c.newT()
	err := c.request(c.rc.Post()).VersionedParams(&opts, params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Update implements Resource.
func (c *resourceClient[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return c.put(ctx, obj, opts, "")
}

// UpdateStatus updates obj's status subresource.
func (c *resourceClient[T, L]) UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	return c.put(ctx, obj, opts, "status")
}

func (c *resourceClient[T, L]) put(ctx context.Context, obj T, opts metav1.UpdateOptions, sub string) (T, error) {
	out := c.newT()
	r := c.request(c.rc.Put()).Name(obj.GetName())
	if sub != "" {
		r = r.SubResource(sub)
	}
	err := r.VersionedParams(&opts, params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Delete implements Resource.
func (c *resourceClient[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.request(c.rc.Delete()).Name(name).Body(&opts).Do(ctx).Error()
}

// Patch implements Resource.
func (c *resourceClient[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := c.newT()
	err := c.request(c.rc.Patch(pt)).Name(name).SubResource(subresources...).VersionedParams(&opts, params).Body(data).Do(ctx).Into(out)
	return out, err
}

// creator is a Creator over a REST client (a review: created, answered,
// never stored).
type creator[T object] struct {
	rc       rest.Interface
	resource string
	newT     func() T
}

// Create implements Creator.
func (c creator[T]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := c.newT()
	err := c.rc.Post().UseProtobufAsDefault().Resource(c.resource).VersionedParams(&opts, params).Body(obj).Do(ctx).Into(out)
	return out, err
}
