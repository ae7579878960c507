// Package kubeauth guards an HTTP endpoint the way kube-rbac-proxy does:
// a request's bearer token is reviewed by the API server (TokenReview),
// and the user it names must be allowed to get the request's path (a
// SubjectAccessReview of the non-resource URL, as for the API server's
// own /metrics). Prometheus's service account gets /metrics through a
// ClusterRole with nonResourceURLs: ["/metrics"], verbs: ["get"].
//
// Decisions are cached for a while, by the token's hash and path, and the
// reviews of tokens not seen before are rate-limited, so a flood of
// made-up tokens costs the API server a bounded rate of reviews.
package kubeauth

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/kube"
)

// Guard wraps handlers with the review.
type Guard struct {
	Client kube.Interface
	// TTL is how long an allowance is cached (zero: a minute); a refusal
	// is cached for a tenth of it.
	TTL time.Duration
	// Reviews is how many reviews a second are made for requests not
	// cached (zero: 10); the rest are answered 429.
	Reviews int
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu     sync.Mutex
	cache  map[[32]byte]decision
	tokens float64
	last   time.Time
}

type decision struct {
	allowed bool
	until   time.Time
}

// maxCache bounds the cache; past it, it is emptied.
const maxCache = 4096

func (g *Guard) now() time.Time {
	if g.Now != nil {
		return g.Now()
	}
	return time.Now()
}

// Wrap answers 401 to a request without a valid token, 403 to one whose
// user may not get the path, and passes the rest to h.
func (g *Guard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="hostpath-csi"`)
			http.Error(w, "a bearer token is required (a service account's allowed to get "+r.URL.Path+")", http.StatusUnauthorized)
			return
		}
		allowed, code, msg := g.decide(r.Context(), token, r.URL.Path)
		if !allowed {
			http.Error(w, msg, code)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (g *Guard) decide(ctx context.Context, token, path string) (bool, int, string) {
	key := sha256.Sum256([]byte(path + "\x00" + token))
	now := g.now()
	g.mu.Lock()
	if d, ok := g.cache[key]; ok && now.Before(d.until) {
		g.mu.Unlock()
		return refusal(d.allowed, path)
	}
	if !g.take(now) {
		g.mu.Unlock()
		return false, http.StatusTooManyRequests, "too many requests to review; retry later"
	}
	g.mu.Unlock()
	allowed, err := g.review(ctx, token, path)
	if err != nil {
		return false, http.StatusServiceUnavailable, "the API server could not review the request; retry later"
	}
	ttl := g.TTL
	if ttl <= 0 {
		ttl = time.Minute
	}
	if !allowed {
		ttl /= 10
	}
	g.mu.Lock()
	if g.cache == nil || len(g.cache) >= maxCache {
		g.cache = map[[32]byte]decision{}
	}
	g.cache[key] = decision{allowed: allowed, until: now.Add(ttl)}
	g.mu.Unlock()
	return refusal(allowed, path)
}

func refusal(allowed bool, path string) (bool, int, string) {
	if allowed {
		return true, http.StatusOK, ""
	}
	return false, http.StatusForbidden, "the token's user may not get " + path
}

// take spends one review from a bucket of Reviews a second; g.mu is held.
func (g *Guard) take(now time.Time) bool {
	rate := float64(g.Reviews)
	if rate <= 0 {
		rate = 10
	}
	if g.last.IsZero() {
		g.tokens = rate
	} else {
		g.tokens = min(rate, g.tokens+now.Sub(g.last).Seconds()*rate)
	}
	g.last = now
	if g.tokens < 1 {
		return false
	}
	g.tokens--
	return true
}

// review asks the API server who the token is and whether they may get
// path; false with no error is a refusal.
func (g *Guard) review(ctx context.Context, token, path string) (bool, error) {
	tr, err := g.Client.TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	if !tr.Status.Authenticated {
		return false, nil
	}
	u := tr.Status.User
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := g.Client.SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return sar.Status.Allowed, nil
}
