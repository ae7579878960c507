package csi

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/iolimit"
)

// podUID is a pod uid of its own.
func podUID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return fmt.Sprintf("%x-0000-4000-8000-000000000000", b)
}

// publishedForPod makes an image volume of size with the mutable
// parameters, stages it and publishes it at a kubelet-shaped target of
// pod uid; all undone when the test ends. It returns the volume's id and
// its target.
func publishedForPod(t *testing.T, d *Driver, name string, size int64, mutable map[string]string, uid string) (id, target string) {
	t.Helper()
	r := createReq(name, size)
	r.Parameters = imageParams
	r.MutableParameters = mutable
	v, err := d.CreateVolume(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	id = v.GetVolume().GetVolumeId()
	t.Cleanup(func() { d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}) })
	base := t.TempDir()
	staging := filepath.Join(base, "staging")
	target = filepath.Join(base, "pods", uid, "volumes", "kubernetes.io~csi", "pvc-1", "mount")
	unmountAll(t, staging, target)
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: rwo}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}) })
	return id, target
}

// TestIOLimits: an image volume's I/O limits (mutable parameters) are
// set in the cgroups of the pod that publishes it, and in a container's
// made after the publish; a modify changes them online; a bad limit, a
// modify while the pod has no cgroup, and limits on a directory volume
// are refused, each leaving the limits in force.
func TestIOLimits(t *testing.T) {
	testutil.RequireRoot(t)
	h, err := iolimit.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatalf("no cgroup I/O controller: %v", err)
	}
	cfg := testConfig(t)
	// The interval is long: what the test sees is the publish's, the
	// modify's and the watch's doing.
	cfg.EnableModifyVolume, cfg.CgroupMount, cfg.IOLimitInterval = true, "/sys/fs/cgroup", time.Hour
	d := newDriver(t, cfg)
	uid := podUID()
	podDir, ctrDir := testutil.PodCgroups(t, h.Root, h.V2, "cgroupfs", uid)
	id, target := publishedForPod(t, d, "limited", 32<<20, map[string]string{engine.MutableReadIOPS: "1000", engine.MutableWriteBPS: "1048576"}, uid)
	dev, err := iolimit.DeviceOf(target)
	if err != nil {
		t.Fatal(err)
	}
	if dev.Major != 7 {
		t.Fatalf("the published image volume shows device %s, want a loop device's", dev)
	}
	want := func(what string, dirs []string, l iolimit.Limits) {
		t.Helper()
		if h.V2 {
			dirs = []string{podDir} // its containers are held to the pod's
		}
		for _, dir := range dirs {
			if got, err := h.Get(dir, dev); err != nil || got != l {
				t.Fatalf("%s: %s holds %+v (%v), want %+v", what, dir, got, err, l)
			}
		}
	}
	both := []string{podDir, ctrDir}
	want("published", both, iolimit.Limits{ReadIOPS: 1000, WriteBytesPerSecond: 1 << 20})

	// A container made after the publish takes them as soon as it is
	// made (cgroup v1's throttling is not hierarchical; the pod's cgroup
	// is watched).
	late := filepath.Join(podDir, "ctr-2")
	if h.V2 {
		late = ctrDir // nothing to write below the pod's on v2
	}
	if !h.V2 {
		if err := os.Mkdir(late, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(late)
	}
	start := time.Now()
	for l, _ := h.Get(late, dev); !h.V2 && l.ReadIOPS != 1000; l, _ = h.Get(late, dev) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("a container's cgroup made after the publish holds %+v after 5 s", l)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("a container's cgroup made after the publish held the limits %v later", time.Since(start))
	both = append(both, late)

	modify := func(params map[string]string) error {
		_, err := d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: params})
		return err
	}
	if err := modify(map[string]string{engine.MutableReadIOPS: "5000"}); err != nil {
		t.Fatal(err)
	}
	in := iolimit.Limits{ReadIOPS: 5000, WriteBytesPerSecond: 1 << 20}
	want("modified online", both, in)

	for _, tc := range []struct {
		name   string
		params map[string]string
		code   codes.Code
		msg    string
	}{
		{"not a number", map[string]string{engine.MutableReadIOPS: "fast"}, codes.InvalidArgument, "positive integer"},
		{"zero", map[string]string{engine.MutableWriteIOPS: "0"}, codes.InvalidArgument, "positive integer"},
		{"negative", map[string]string{engine.MutableReadBPS: "-1"}, codes.InvalidArgument, "positive integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := modify(tc.params)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("%v, want %v saying %q", err, tc.code, tc.msg)
			}
			want("after a refused modify", both, in)
		})
	}

	t.Run("pod gone", func(t *testing.T) {
		for _, dir := range []string{late, ctrDir, podDir} {
			if err := os.Remove(dir); err != nil && !(h.V2 && dir == late && errors.Is(err, fs.ErrNotExist)) {
				t.Fatal(err)
			}
		}
		err := modify(map[string]string{engine.MutableReadIOPS: "7000"})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "has no cgroup") {
			t.Fatalf("a modify while the pod has no cgroup: %v, want FailedPrecondition saying so", err)
		}
		// The record kept the old read limit: a modify of another limit,
		// once the pod's cgroup is there again, sets it with the old one.
		testutil.PodCgroups(t, h.Root, h.V2, "cgroupfs", uid)
		if err := modify(map[string]string{engine.MutableWriteIOPS: "300"}); err != nil {
			t.Fatal(err)
		}
		want("after a refused modify and another", []string{podDir, ctrDir}, iolimit.Limits{ReadIOPS: 5000, WriteIOPS: 300, WriteBytesPerSecond: 1 << 20})
	})

	t.Run("directory volume", func(t *testing.T) {
		r := createReq("dir-limited", 16<<20)
		r.Parameters = map[string]string{engine.ParamLayout: engine.LayoutDirectory}
		r.MutableParameters = map[string]string{engine.MutableReadIOPS: "1000"}
		if _, err := d.CreateVolume(ctx, r); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "directory volume") {
			t.Fatalf("a directory volume with I/O limits: %v, want InvalidArgument naming the layout", err)
		}
		r.MutableParameters = nil
		dv, err := d.CreateVolume(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		defer d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: dv.GetVolume().GetVolumeId()})
		_, err = d.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: dv.GetVolume().GetVolumeId(), MutableParameters: map[string]string{engine.MutableWriteIOPS: "10"}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "directory volume") {
			t.Fatalf("I/O limits on a directory volume: %v, want InvalidArgument naming the layout", err)
		}
	})
}
