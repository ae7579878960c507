package csi

import (
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestImageGrowth: what an image volume's growth may and may not do.
//   - A volume expanded while unstaged is staged at its new size, with or
//     without CAP_SYS_RESOURCE (which ext4's online resize needs and this
//     VM's root lacks; the kernel guests have it): format/ext4 grows its
//     own layout before the mount.
//   - Past what the file system's descriptor blocks map (16 GiB for one
//     made at 64 MiB), the offline growth goes as far as they map, and the
//     kernel's online resize does the rest; where it cannot (no
//     CAP_SYS_RESOURCE), the volume is staged anyway, at the file system's
//     size, reported by health (FileSystemNotGrown), by the notifier and
//     by stats.
//   - An expansion past the largest file system its image holds (16 TiB
//     for ext4) is OutOfRange, on a pool whose files could grow past it.
//   - A clone asked smaller than its source, with no limit, is its
//     source's size.
func TestImageGrowth(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxVolumeSize = 1 << 50
	d := newDriver(t, cfg)
	var mu sync.Mutex
	var notes []string
	d.eng.SetNotifier(func(pv, reason, msg string) {
		mu.Lock()
		notes = append(notes, pv+" "+reason+": "+msg)
		mu.Unlock()
	})
	const size, bigger, past = 64 << 20, 256 << 20, 16<<30 + 256<<20
	v := createImage(t, d, "img", size, nil)
	id := v.GetVolumeId()
	staged := func(to int64) (fsBytes, statsBytes int64, health string) {
		t.Helper()
		if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: to}, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		staging, target := stageAndPublish(t, d, id)
		defer func() {
			if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
				t.Fatal(err)
			}
		}()
		st, err := fsops.Statfs(staging)
		if err != nil {
			t.Fatal(err)
		}
		h, err := d.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		stats, err := d.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
		if err != nil {
			t.Fatal(err)
		}
		return st.TotalBytes, stats.GetUsage()[0].GetTotal(), h.String()
	}
	if got, stats, h := staged(bigger); got < bigger*9/10 || got > bigger || stats != got || strings.Contains(h, "FileSystemNotGrown") {
		t.Fatalf("expanded from %d to %d bytes unstaged: staged a file system of %d bytes, stats %d, health %s", size, bigger, got, stats, h)
	}
	// Past ext4's largest, on this pool (the test's root ext4, whose
	// files reach 16 TiB too; an XFS pool's go further): refused.
	_, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 17 << 40}, VolumeCapability: rwo})
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "ext4") {
		t.Fatalf("expanding an ext4 image volume to 17 TiB: %v, want OutOfRange naming ext4", err)
	}

	// A clone asked smaller than its source.
	r := createReq("clone", 32<<20)
	r.Parameters = imageParams
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	c, err := d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatalf("a clone asked smaller than its source: %v", err)
	}
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: c.GetVolume().GetVolumeId()}) })
	if got := c.GetVolume().GetCapacityBytes(); got != bigger {
		t.Fatalf("the clone has %d bytes, want its source's %d", got, bigger)
	}
	r.Name, r.CapacityRange = "clone-limited", &csi.CapacityRange{RequiredBytes: 32 << 20, LimitBytes: 64 << 20}
	if _, err := d.CreateVolume(ctx, r); status.Code(err) != codes.OutOfRange {
		t.Fatalf("a clone limited below its source: %v, want OutOfRange", err)
	}

	got, stats, h := staged(past)
	switch {
	case testutil.HasCap(unix.CAP_SYS_RESOURCE):
		if got < past*9/10 || strings.Contains(h, "FileSystemNotGrown") {
			t.Fatalf("with CAP_SYS_RESOURCE: a file system of %d bytes staged in a %d-byte volume, health %v", got, past, h)
		}
	default:
		if got < 15<<30 || got > 16<<30 || stats != got || !strings.Contains(h, "FileSystemNotGrown") {
			t.Fatalf("without CAP_SYS_RESOURCE: staged a %d-byte file system in a %d-byte volume, stats %d, health %v; want the 16 GiB one descriptor block maps, reported", got, past, stats, h)
		}
		mu.Lock()
		told := strings.Join(notes, "\n")
		mu.Unlock()
		if !strings.HasPrefix(told, "img FileSystemNotGrown: ") || !strings.Contains(told, "CAP_SYS_RESOURCE") {
			t.Fatalf("the notifier (an event on the PV, in a cluster) was told %q", told)
		}
		t.Logf("no CAP_SYS_RESOURCE here: grown offline to %d bytes, health: %s", got, h)
	}
}

// TestImageGrowthAddingNothing: where a growth adds nothing to an image
// volume's file system (ext4 grown by a tail too short for a group), the
// growth is done: the next stage does not resize again. Counted from the
// driver's log of each online resize it asks: the offline growth before
// the mount and the online one agree on how far the file system reaches,
// so neither asks the kernel for a tail it would not make. A resize that
// fails is tried again at the next stage, as a failure must be.
func TestImageGrowthAddingNothing(t *testing.T) {
	var mu sync.Mutex
	resizes := 0
	klog.SetLogger(funcr.New(func(prefix, args string) {
		if strings.Contains(args, "resizing an image volume's file system") {
			mu.Lock()
			resizes++
			mu.Unlock()
		}
	}, funcr.Options{Verbosity: 2}))
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	fs.Set("v", "2")
	t.Cleanup(func() { fs.Set("v", "0"); klog.ClearLogger() })
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return resizes
	}
	canGrow := testutil.HasCap(unix.CAP_SYS_RESOURCE)
	d := newDriver(t, testConfig(t))
	for _, tc := range []struct{ size, grown int64 }{
		{128 << 20, 130 << 20}, {256 << 20, 258 << 20}, {1 << 30, 1<<30 + 2<<20}, {64 << 20, 96 << 20},
	} {
		v := createImage(t, d, fmt.Sprintf("img-%d", tc.size), tc.size, nil)
		id := v.GetVolumeId()
		if _, err := d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: tc.grown}, VolumeCapability: rwo}); err != nil {
			t.Fatal(err)
		}
		staging := filepath.Join(t.TempDir(), "staging")
		unmountAll(t, staging)
		stage := func() (resized int, bytes int64) {
			t.Helper()
			before := count()
			if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
				t.Fatal(err)
			}
			st, err := fsops.Statfs(staging)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
				t.Fatal(err)
			}
			return count() - before, st.TotalBytes
		}
		first, b1 := stage()
		second, b2 := stage()
		t.Logf("%d -> %d bytes: resized %d times at the first stage (%d bytes), %d at the second (%d bytes)", tc.size, tc.grown, first, b1, second, b2)
		switch {
		case canGrow && second != 0:
			t.Fatalf("%d -> %d bytes: the second stage resized again (%d times) after the first made the file system %d bytes", tc.size, tc.grown, second, b1)
		case !canGrow && first > 0 && second == 0:
			t.Fatalf("%d -> %d bytes: a resize that failed was not tried again", tc.size, tc.grown)
		}
	}
}
