package csi

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// A check that cannot decide stops the operation: when the mount table
// cannot be read, nothing is deleted, unmounted or reported as if the
// volume were not mounted.
func TestMountInspectionFailureStopsOperations(t *testing.T) {
	testutil.RequireRoot(t)
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "pvc-failclosed", 1<<20)
	id := v.GetVolumeId()
	base := t.TempDir()
	staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
	unmountAll(t, staging, target)
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	sw := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: sw}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(volumeDir(d, id), "keep")
	if err := os.WriteFile(data, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	var broken atomic.Bool
	d.eng.MountPoint = func(p string) (*fsops.MountPoint, error) {
		if broken.Load() {
			return nil, &os.PathError{Op: "read mountinfo", Path: p, Err: unix.EIO}
		}
		return fsops.GetMountPoint(p)
	}
	broken.Store(true)

	calls := []struct {
		name string
		call func() error
	}{
		{"DeleteVolume", func() error {
			_, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
			return err
		}},
		{"NodeUnpublishVolume", func() error {
			_, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		}},
		{"NodeUnstageVolume", func() error {
			_, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
			return err
		}},
		{"NodePublishVolume second single writer", func() error {
			_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: filepath.Join(base, "second"), VolumeCapability: sw})
			return err
		}},
		{"NodeGetVolumeStats", func() error {
			_, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
			return err
		}},
		{"NodeExpandVolume", func() error {
			_, err := d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target})
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			wantCode(t, err, codes.FailedPrecondition)
			if !strings.Contains(err.Error(), "cannot tell whether") {
				t.Fatalf("message does not say what could not be decided: %v", err)
			}
			if _, err := os.Stat(data); err != nil {
				t.Fatalf("volume data touched: %v", err)
			}
			if mountOf(t, target) == nil || mountOf(t, staging) == nil {
				t.Fatal("a mount was removed")
			}
		})
	}
	h, err := d.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: target})
	if err != nil {
		t.Fatal(err)
	}
	if hs := h.GetVolumeHealth().GetHealthStatuses(); len(hs) != 1 || hs[0].GetReason() != "MountUninspectable" {
		t.Fatalf("health while inspection fails: %v", hs)
	}

	broken.Store(false)
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
}
