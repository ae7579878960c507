package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// demo walks one volume through its life and prints every step with the
// time it took, so a newcomer sees what the driver does.
func (c client) demo(ctx context.Context, dir string) (retErr error) {
	mountCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	suffix := fmt.Sprint(time.Now().UnixNano())
	// Each step's undo, run last first; one that fails is reported and
	// fails the demo, since it leaves something on the driver.
	var cleanup []func() error
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			if err := cleanup[i](); err != nil {
				fmt.Fprintf(os.Stderr, "cleaning up: %v\n", err)
				if retErr == nil {
					retErr = err
				}
			}
		}
	}()
	step := func(what string, f func() (string, error)) error {
		start := time.Now()
		out, err := f()
		d := time.Since(start).Round(time.Microsecond)
		if err != nil {
			fmt.Printf("%-34s FAILED after %v: %v\n", what, d, err)
			return err
		}
		fmt.Printf("%-34s %10v  %s\n", what, d, out)
		return nil
	}

	var vol, clone, restored *csi.Volume
	var snap *csi.Snapshot
	staging := filepath.Join(dir, "staging")
	target := filepath.Join(dir, "target")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return err
	}
	if err := step("CreateVolume (100 MiB directory)", func() (string, error) {
		r, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "demo-" + suffix, VolumeCapabilities: []*csi.VolumeCapability{mountCap},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 100 << 20}})
		if err != nil {
			return "", err
		}
		vol = r.GetVolume()
		cleanup = append(cleanup, func() error {
			_, err := c.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: vol.GetVolumeId()})
			return err
		})
		return vol.GetVolumeId(), nil
	}); err != nil {
		return err
	}
	if err := step("NodeStageVolume", func() (string, error) {
		_, err := c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: mountCap})
		cleanup = append(cleanup, func() error {
			_, err := c.node.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
			return err
		})
		return "bind mount at " + staging, err
	}); err != nil {
		return err
	}
	if err := step("NodePublishVolume", func() (string, error) {
		_, err := c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap})
		cleanup = append(cleanup, func() error {
			_, err := c.node.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), TargetPath: target})
			return err
		})
		return "bind mount at " + target, err
	}); err != nil {
		return err
	}
	var sum string
	if err := step("write 32 MiB into the volume", func() (string, error) {
		f, err := os.Create(filepath.Join(target, "data.bin"))
		if err != nil {
			return "", err
		}
		h := sha256.New()
		buf := make([]byte, 1<<20)
		for i := 0; i < 32; i++ {
			for j := range buf {
				buf[j] = byte(i*7 + j%251)
			}
			if _, err := io.MultiWriter(f, h).Write(buf); err != nil {
				f.Close()
				return "", err
			}
		}
		if err := f.Close(); err != nil {
			return "", err
		}
		sum = fmt.Sprintf("%x", h.Sum(nil))[:16]
		return "data.bin sha256 " + sum + "...", nil
	}); err != nil {
		return err
	}
	if err := step("NodeGetVolumeStats", func() (string, error) {
		r, err := c.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: target})
		if err != nil {
			return "", err
		}
		u := r.GetUsage()[0]
		return fmt.Sprintf("used %d of %d bytes", u.GetUsed(), u.GetTotal()), nil
	}); err != nil {
		return err
	}
	if err := step("CreateSnapshot (tar.gz, in-process)", func() (string, error) {
		// Answered once cut, ready_to_use false until its archive is
		// made: asked again, as the csi-snapshotter does, until ready.
		req := &csi.CreateSnapshotRequest{Name: "demo-snap-" + suffix, SourceVolumeId: vol.GetVolumeId()}
		r, err := c.ctrl.CreateSnapshot(ctx, req)
		for err == nil && !r.GetSnapshot().GetReadyToUse() {
			time.Sleep(50 * time.Millisecond)
			r, err = c.ctrl.CreateSnapshot(ctx, req)
		}
		if err != nil {
			return "", err
		}
		snap = r.GetSnapshot()
		cleanup = append(cleanup, func() error {
			_, err := c.ctrl.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
			return err
		})
		return fmt.Sprintf("%s, %d bytes", snap.GetSnapshotId(), snap.GetSizeBytes()), nil
	}); err != nil {
		return err
	}
	if err := step("CreateVolume from snapshot", func() (string, error) {
		r, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "demo-restore-" + suffix, VolumeCapabilities: []*csi.VolumeCapability{mountCap},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()}}}})
		if err != nil {
			return "", err
		}
		restored = r.GetVolume()
		cleanup = append(cleanup, func() error {
			_, err := c.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: restored.GetVolumeId()})
			return err
		})
		return restored.GetVolumeId(), nil
	}); err != nil {
		return err
	}
	if err := step("CreateVolume as clone", func() (string, error) {
		r, err := c.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "demo-clone-" + suffix, VolumeCapabilities: []*csi.VolumeCapability{mountCap},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetVolumeId()}}}})
		if err != nil {
			return "", err
		}
		clone = r.GetVolume()
		cleanup = append(cleanup, func() error {
			_, err := c.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: clone.GetVolumeId()})
			return err
		})
		return clone.GetVolumeId(), nil
	}); err != nil {
		return err
	}
	fmt.Println("cleaning up (unpublish, unstage, delete)")
	return nil
}
