package csi

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

func TestStripSecrets(t *testing.T) {
	req := &csi.CreateVolumeRequest{Name: "v", Secrets: map[string]string{"password": "hunter2"}, Parameters: map[string]string{"kind": "fast"}}
	out := stripSecrets(req)
	if strings.Contains(out, "hunter2") || !strings.Contains(out, "stripped") || !strings.Contains(out, "fast") {
		t.Fatalf("stripped request: %s", out)
	}
	if req.Secrets["password"] != "hunter2" {
		t.Fatal("stripping changed the request itself")
	}
}

func TestInterceptorRecoversPanic(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: "/csi.v1.Controller/CreateVolume"}
	_, err := logInterceptor(context.Background(), &csi.CreateVolumeRequest{}, info, func(context.Context, any) (any, error) {
		panic("boom")
	})
	wantCode(t, err, codes.Internal)
}
