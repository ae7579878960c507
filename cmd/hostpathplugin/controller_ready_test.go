package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/hostpath-csi/hostpath/kube"
)

// TestGroupSnapshotAPIReady: the controller's Probe waits for the API
// server to answer about the group snapshot API: served (200) or not
// installed (404) is an answer; a server error or no server is not.
func TestGroupSnapshotAPIReady(t *testing.T) {
	for _, tc := range []struct {
		name  string
		code  int
		ready bool
	}{
		{"served", http.StatusOK, true},
		{"not installed", http.StatusNotFound, true},
		{"server error", http.StatusServiceUnavailable, false},
		{"no server", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/apis/groupsnapshot.storage.k8s.io/v1" {
					t.Errorf("asked for %s", r.URL.Path)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.code)
				w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"groupsnapshot.storage.k8s.io/v1","resources":[]}`))
			}))
			host := srv.URL
			if tc.code == 0 {
				srv.Close() // nobody listens there now
			} else {
				defer srv.Close()
			}
			client, err := kube.NewForConfig(&rest.Config{Host: host})
			if err != nil {
				t.Fatal(err)
			}
			err = groupSnapshotAPIReady(client)(context.Background())
			if (err == nil) != tc.ready {
				t.Fatalf("ready %v (%v), want %v", err == nil, err, tc.ready)
			}
		})
	}
}
