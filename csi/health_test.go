package csi

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/loop"
)

func reasons(h *csi.VolumeHealth) []string {
	var out []string
	for _, e := range h.GetHealthStatuses() {
		out = append(out, e.GetReason())
	}
	return out
}

func TestVolumeHealth(t *testing.T) {
	d := newDriver(t, testConfig(t))
	ok := mustCreate(t, d, "healthy", 1<<20)
	gone := mustCreate(t, d, "gone", 1<<20)
	os.RemoveAll(volumeDir(d, gone.GetVolumeId()))
	blk := createBlock(t, d, "blk", 1<<20)
	dev, _, _ := loop.Find(filepath.Join(volumesDir(d), blk.GetVolumeId()+".img"))
	loop.Detach(dev)

	tests := []struct {
		id     string
		reason string
	}{
		{ok.GetVolumeId(), ""},
		{gone.GetVolumeId(), "VolumeDataMissing"},
		{blk.GetVolumeId(), "LoopDeviceDetached"},
	}
	for _, tc := range tests {
		r, err := d.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: tc.id})
		if err != nil {
			t.Fatal(err)
		}
		got := reasons(r.GetVolumeHealth())
		if (tc.reason == "" && len(got) != 0) || (tc.reason != "" && (len(got) != 1 || got[0] != tc.reason)) {
			t.Errorf("%s: health %v, want %q", tc.id, got, tc.reason)
		}
	}
	n, err := d.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: ok.GetVolumeId(), VolumePublishPath: t.TempDir()})
	if err != nil || len(reasons(n.GetVolumeHealth())) != 1 || reasons(n.GetVolumeHealth())[0] != "NotMounted" {
		t.Fatalf("node health of an unmounted path: %v %v", n, err)
	}
	l, err := d.ControllerListVolumeHealth(ctx, &csi.ControllerListVolumeHealthRequest{MaxEntries: 2})
	if err != nil || len(l.GetEntries()) != 2 || l.GetNextToken() == "" {
		t.Fatalf("list health: %v %v", l, err)
	}
	_, err = d.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: engine.NewID(engine.VolumeIDPrefix, engine.NodeTag("elsewhere"))})
	wantCode(t, err, codes.ResourceExhausted)
	_, err = d.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{})
	wantCode(t, err, codes.InvalidArgument)
}

func TestStorageHealth(t *testing.T) {
	d := newDriver(t, testConfig(t))
	r, err := d.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(r.GetBackendHealth()) != 0 {
		t.Fatalf("healthy state dir: %v %v", r, err)
	}
	os.Chmod(tmpDir(d), 0o500)
	defer os.Chmod(tmpDir(d), 0o755)
	if os.Geteuid() == 0 {
		// root ignores modes: take the directory away instead.
		os.Rename(tmpDir(d), tmpDir(d)+".away")
		defer os.Rename(tmpDir(d)+".away", tmpDir(d))
	}
	r, _ = d.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{})
	if len(r.GetBackendHealth()) != 1 || r.GetBackendHealth()[0].GetReason() != "StateDirNotWritable" {
		t.Fatalf("unwritable state dir: %v", r)
	}
}
