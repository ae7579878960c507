package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Lister is what an informer needs of a Resource.
type Lister[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Informer is a shared informer of the objects of res (a resource of api)
// that tweak (when set) selects, of example's type, as client-go's informer
// factories make one (they would link every API group's informers and
// listers). An api that cannot stream its first list (a test's fake says
// so) is listed and then watched.
func Informer[L runtime.Object](api Interface, res Lister[L], example runtime.Object, resync time.Duration, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return res.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return res.Watch(ctx, o)
		},
	}, api)
	return cache.NewSharedIndexInformer(lw, example, resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}
