package kubeauth

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hostpath-csi/hostpath/kube/kubefake"
)

// TestGuard: /metrics answers only a token of a user allowed to get it;
// decisions are cached; a flood of made-up tokens costs the API server
// no more than the review rate.
func TestGuard(t *testing.T) {
	client := fake.NewClientset()
	var reviews atomic.Int64
	users := map[string]string{"prom-token": "system:serviceaccount:monitoring:prometheus", "pod-token": "system:serviceaccount:app:default"}
	client.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		if u, ok := users[tr.Spec.Token]; ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: u}}
		}
		return true, tr, nil
	})
	client.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview)
		sar.Status.Allowed = sar.Spec.User == users["prom-token"] && sar.Spec.NonResourceAttributes.Path == "/metrics" && sar.Spec.NonResourceAttributes.Verb == "get"
		return true, sar, nil
	})
	now := time.Unix(1e9, 0)
	g := &Guard{Client: kubefake.New(client, nil), Reviews: 5, Now: func() time.Time { return now }}
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("volume_id=vol-1 path=/var/lib/x")) }))
	get := func(token string) int {
		r := httptest.NewRequest("GET", "/metrics", nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for _, c := range []struct {
		token string
		want  int
	}{
		{"", http.StatusUnauthorized},
		{"prom-token", http.StatusOK},
		{"pod-token", http.StatusForbidden},
		{"made-up", http.StatusForbidden},
	} {
		if got := get(c.token); got != c.want {
			t.Errorf("token %q: %d, want %d", c.token, got, c.want)
		}
	}
	before := reviews.Load()
	for range 10 {
		if get("prom-token") != http.StatusOK {
			t.Fatal("a cached allowance was refused")
		}
	}
	if reviews.Load() != before {
		t.Fatalf("cached requests made %d reviews", reviews.Load()-before)
	}
	// A flood of new tokens within one second: at most the rate.
	limited := 0
	for i := range 100 {
		if get("flood-"+string(rune('a'+i%26))+string(rune('a'+i/26))) == http.StatusTooManyRequests {
			limited++
		}
	}
	if n := reviews.Load() - before; n > 5 || limited < 95 {
		t.Fatalf("a flood of 100 tokens made %d reviews (%d limited), want at most 5", n, limited)
	}
	now = now.Add(2 * time.Minute)
	if get("prom-token") != http.StatusOK {
		t.Fatal("after the cache and the bucket refill, the allowed token is refused")
	}
}
