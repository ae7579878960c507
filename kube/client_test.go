package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	authnv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// asked is one request as the API server saw it.
type asked struct {
	method, path, query, accept, contentType string
}

// apiServer answers every request with a JSON object named "answered"
// (which decodes into any of the caller's types), records what it was
// asked, and streams one ADDED event to a watch (then the bookmark that
// ends a streamed list, when the watch asked for one).
func apiServer(t *testing.T) (*Client, func() []asked) {
	t.Helper()
	var mu sync.Mutex
	var seen []asked
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, asked{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Accept"), r.Header.Get("Content-Type")})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		obj := map[string]any{"metadata": map[string]any{"name": "answered", "resourceVersion": "7"}}
		switch {
		case r.URL.Query().Get("watch") == "true":
			obj["kind"], obj["apiVersion"] = "VolumeSnapshot", "snapshot.storage.k8s.io/v1"
			obj["metadata"].(map[string]any)["namespace"] = "ns"
			json.NewEncoder(w).Encode(map[string]any{"type": "ADDED", "object": obj})
			if r.URL.Query().Get("sendInitialEvents") == "true" { // the list streamed: its end marked
				json.NewEncoder(w).Encode(map[string]any{"type": "BOOKMARK", "object": map[string]any{
					"kind": "VolumeSnapshot", "apiVersion": "snapshot.storage.k8s.io/v1", "metadata": map[string]any{
						"resourceVersion": "8", "annotations": map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}})
			}
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		case strings.HasSuffix(r.URL.Path, "/volumesnapshots"):
			obj = map[string]any{"kind": "VolumeSnapshotList", "apiVersion": "snapshot.storage.k8s.io/v1",
				"metadata": map[string]any{"resourceVersion": "7"}, "items": []any{obj}}
		case strings.HasSuffix(r.URL.Path, "/tokenreviews"):
			obj["status"] = map[string]any{"authenticated": true}
		}
		json.NewEncoder(w).Encode(obj)
	}))
	t.Cleanup(srv.Close)
	k, err := NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return k, func() []asked {
		mu.Lock()
		defer mu.Unlock()
		return append([]asked(nil), seen...)
	}
}

// TestClient: each resource is asked at its API path, built-in types as
// protobuf first and custom ones as JSON, subresources where the API has
// them, and the answers decode into the driver's types.
func TestClient(t *testing.T) {
	const proto = "application/vnd.kubernetes.protobuf"
	for _, tc := range []struct {
		name string
		call func(context.Context, *Client) (string, error)
		want asked
	}{
		{"a node", func(ctx context.Context, k *Client) (string, error) {
			n, err := k.Nodes().Get(ctx, "n1", metav1.GetOptions{})
			return n.Name, err
		}, asked{method: "GET", path: "/api/v1/nodes/n1", accept: proto}},
		{"a namespace's snapshots", func(ctx context.Context, k *Client) (string, error) {
			l, err := k.VolumeSnapshots("ns").List(ctx, metav1.ListOptions{FieldSelector: "spec.x="})
			if err != nil || len(l.Items) != 1 {
				return "", err
			}
			return l.Items[0].Name, err
		}, asked{method: "GET", path: "/apis/snapshot.storage.k8s.io/v1/namespaces/ns/volumesnapshots", query: "fieldSelector=spec.x%3D", accept: "application/json"}},
		{"a content patched", func(ctx context.Context, k *Client) (string, error) {
			c, err := k.VolumeSnapshotContents().Patch(ctx, "c1", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
			return c.Name, err
		}, asked{method: "PATCH", path: "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/c1", accept: "application/json", contentType: "application/merge-patch+json"}},
		{"a request approved", func(ctx context.Context, k *Client) (string, error) {
			c, err := k.CertificateSigningRequests().UpdateApproval(ctx, "r1", &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "r1"}}, metav1.UpdateOptions{})
			return c.Name, err
		}, asked{method: "PUT", path: "/apis/certificates.k8s.io/v1/certificatesigningrequests/r1/approval", accept: proto, contentType: proto}},
		{"a certificate issued", func(ctx context.Context, k *Client) (string, error) {
			c, err := k.CertificateSigningRequests().UpdateStatus(ctx, &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "r1"}}, metav1.UpdateOptions{})
			return c.Name, err
		}, asked{method: "PUT", path: "/apis/certificates.k8s.io/v1/certificatesigningrequests/r1/status", accept: proto, contentType: proto}},
		{"a token reviewed", func(ctx context.Context, k *Client) (string, error) {
			r, err := k.TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: "t"}}, metav1.CreateOptions{})
			if err == nil && !r.Status.Authenticated {
				t.Error("the review's status was not decoded")
			}
			return r.Name, err
		}, asked{method: "POST", path: "/apis/authentication.k8s.io/v1/tokenreviews", accept: proto, contentType: proto}},
		{"a group's discovery", func(ctx context.Context, k *Client) (string, error) {
			return "answered", k.Served(ctx, "/apis/groupsnapshot.storage.k8s.io/v1")
		}, asked{method: "GET", path: "/apis/groupsnapshot.storage.k8s.io/v1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, seen := apiServer(t)
			got, err := tc.call(context.Background(), k)
			if err != nil || got != "answered" {
				t.Fatalf("answer %q, %v", got, err)
			}
			s := seen()
			if len(s) != 1 {
				t.Fatalf("asked %+v, want one request", s)
			}
			a := s[0]
			if a.method != tc.want.method || a.path != tc.want.path || a.query != tc.want.query ||
				!strings.HasPrefix(a.accept, tc.want.accept) || a.contentType != tc.want.contentType {
				t.Errorf("asked %+v, want %+v", a, tc.want)
			}
		})
	}
}

// TestInformer: an informer over Client streams its first list (client-go's
// default, as the informer factories did) and holds what it brought.
func TestInformer(t *testing.T) {
	k, seen := apiServer(t)
	inf := Informer(k, k.VolumeSnapshots("ns"), &snapv1.VolumeSnapshot{}, time.Minute, func(o *metav1.ListOptions) { o.LabelSelector = "a=b" })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var running sync.WaitGroup
	running.Go(func() { inf.Run(ctx.Done()) })
	defer running.Wait()
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("never synced")
	}
	if _, ok, _ := inf.GetStore().GetByKey("ns/answered"); !ok {
		t.Fatalf("the informer holds %v", inf.GetStore().ListKeys())
	}
	for _, a := range seen() {
		if a.path != "/apis/snapshot.storage.k8s.io/v1/namespaces/ns/volumesnapshots" || !strings.Contains(a.query, "labelSelector=a%3Db") {
			t.Errorf("asked %+v", a)
		}
	}
}
