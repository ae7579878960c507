// Package crash kills the driver with SIGKILL at random moments, inside
// operations as well as between them, restarts it, and checks that it lost
// nothing, lists nothing half-made, accepts the retry of whatever was in
// flight, and leaves nothing behind once everything is deleted.
package crash

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

var rwo = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

type harness struct {
	t              *testing.T
	bin, dir, sock string
	state, mnt     string
	cmd            *exec.Cmd
	conn           *grpc.ClientConn
	ctrl           csi.ControllerClient
	node           csi.NodeClient
	volumes        map[string][32]byte // volume id -> sha256 of its file
	volNames       map[string]string   // name -> id
	snaps          map[string][32]byte // snapshot id -> content of its source
	snapNames      map[string]string
	seq            int
	args           []string // more flags for the driver
}

func (h *harness) start() {
	h.t.Helper()
	h.cmd = exec.Command(h.bin, append([]string{"--endpoint=unix://" + h.sock, "--nodeid=crash-node", "--statedir=" + h.state, "-v=0"}, h.args...)...)
	h.cmd.Stderr = os.Stderr
	if err := h.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	var err error
	// Retry fast: the socket of the killed driver lingers until the new
	// one replaces it.
	h.conn, err = grpc.NewClient("unix://"+h.sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, MaxDelay: 50 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		h.t.Fatal(err)
	}
	h.ctrl, h.node = csi.NewControllerClient(h.conn), csi.NewNodeClient(h.conn)
	id := csi.NewIdentityClient(h.conn)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := id.Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil && r.GetReady().GetValue() {
			return
		}
	}
	h.t.Fatal("driver did not become ready after restart")
}

func (h *harness) kill() {
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
	h.conn.Close()
}

func content(seed int) []byte {
	r := rand.New(rand.NewPCG(uint64(seed), 7))
	b := make([]byte, 128<<10+r.IntN(64<<10))
	for i := range b {
		b[i] = byte(r.IntN(26) + 'a')
	}
	return b
}

// op is one request; run sends it and records its effect in the model
// when it succeeds. Running it again is the CO's retry.
type op struct {
	desc string
	run  func(ctx context.Context) error
}

func (h *harness) pick(r *rand.Rand) op {
	h.seq++
	n := h.seq
	vols, snaps := keys(h.volumes), keys(h.snaps)
	k := r.IntN(100)
	switch {
	case k < 30 || len(vols) == 0:
		name := fmt.Sprintf("vol-%d", n)
		data := content(n)
		return op{"create " + name, func(ctx context.Context) error {
			resp, err := h.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}})
			if err != nil {
				return err
			}
			id := resp.GetVolume().GetVolumeId()
			if _, known := h.volumes[id]; !known {
				if err := os.WriteFile(filepath.Join(h.state, "volumes", id, "data"), data, 0o644); err != nil {
					return err
				}
				h.volumes[id] = sha256.Sum256(data)
			}
			h.volNames[name] = id
			return nil
		}}
	case k < 50 && len(h.snaps) < 6:
		src := vols[r.IntN(len(vols))]
		name := fmt.Sprintf("snap-%d", n)
		return op{"snapshot " + src, func(ctx context.Context) error {
			resp, err := testutil.SnapshotReady(ctx, testutil.Client(h.ctrl), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: src})
			if err != nil {
				return err
			}
			h.snaps[resp.GetSnapshot().GetSnapshotId()] = h.volumes[src]
			h.snapNames[name] = resp.GetSnapshot().GetSnapshotId()
			return nil
		}}
	case k < 65 && len(snaps) > 0:
		snap := snaps[r.IntN(len(snaps))]
		name := fmt.Sprintf("restore-%d", n)
		return op{"restore " + snap, func(ctx context.Context) error {
			resp, err := h.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}})
			if err != nil {
				return err
			}
			h.volumes[resp.GetVolume().GetVolumeId()] = h.snaps[snap]
			return nil
		}}
	case k < 80:
		src := vols[r.IntN(len(vols))]
		name := fmt.Sprintf("clone-%d", n)
		return op{"clone " + src, func(ctx context.Context) error {
			resp, err := h.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src}}}})
			if err != nil {
				return err
			}
			h.volumes[resp.GetVolume().GetVolumeId()] = h.volumes[src]
			return nil
		}}
	case k < 88:
		v := vols[r.IntN(len(vols))]
		return op{"expand " + v, func(ctx context.Context) error {
			_, err := h.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v, CapacityRange: &csi.CapacityRange{RequiredBytes: int64(16+n%16) << 20}})
			return err
		}}
	case k < 94 || len(snaps) == 0:
		v := vols[r.IntN(len(vols))]
		return op{"delete " + v, func(ctx context.Context) error {
			if _, err := h.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v}); err != nil {
				return err
			}
			delete(h.volumes, v)
			return nil
		}}
	default:
		s := snaps[r.IntN(len(snaps))]
		return op{"delete " + s, func(ctx context.Context) error {
			if _, err := h.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s}); err != nil {
				return err
			}
			delete(h.snaps, s)
			return nil
		}}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	// map order is random; sort for a reproducible choice per seed
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// verify: the driver lists exactly the model, every volume holds its
// data, every snapshot is ready. With publish, every volume is also
// published and its data read through the publication (each publish and
// unpublish is a durable record: with dozens of volumes, doing that after
// every kill was most of the test's time); without, the data is read in
// the volume's directory.
func (h *harness) verify(ctx context.Context, publish bool) {
	h.t.Helper()
	lv, err := h.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		h.t.Fatal(err)
	}
	if len(lv.GetEntries()) != len(h.volumes) {
		h.t.Fatalf("driver lists %d volumes, %d exist", len(lv.GetEntries()), len(h.volumes))
	}
	for _, e := range lv.GetEntries() {
		id := e.GetVolume().GetVolumeId()
		want, ok := h.volumes[id]
		if !ok {
			h.t.Fatalf("driver lists unknown volume %s", id)
		}
		if !publish {
			got, err := os.ReadFile(filepath.Join(h.state, "volumes", id, "data"))
			if err != nil || sha256.Sum256(got) != want {
				h.t.Fatalf("volume %s: data differs after crashes (%v)", id, err)
			}
			continue
		}
		target := filepath.Join(h.mnt, id)
		if _, err := h.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: rwo}); err != nil {
			h.t.Fatalf("publishing %s: %v", id, err)
		}
		got, err := os.ReadFile(filepath.Join(target, "data"))
		if _, uerr := h.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); uerr != nil {
			h.t.Fatalf("unpublishing %s: %v", id, uerr)
		}
		if err != nil || sha256.Sum256(got) != want {
			h.t.Fatalf("volume %s: data differs after crashes (%v)", id, err)
		}
	}
	ls, err := h.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		h.t.Fatal(err)
	}
	if len(ls.GetEntries()) != len(h.snaps) {
		h.t.Fatalf("driver lists %d snapshots, %d exist", len(ls.GetEntries()), len(h.snaps))
	}
	for _, e := range ls.GetEntries() {
		if _, ok := h.snaps[e.GetSnapshot().GetSnapshotId()]; !ok || !e.GetSnapshot().GetReadyToUse() {
			h.t.Fatalf("snapshot %v is unknown or not ready", e.GetSnapshot())
		}
	}
}

func TestCrashConsistency(t *testing.T) {
	testutil.RequireRoot(t)
	iterations := 50
	if s := os.Getenv("CRASH_ITERATIONS"); s != "" {
		iterations, _ = strconv.Atoi(s)
	}
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, bin: filepath.Join(dir, "hostpathplugin"), sock: filepath.Join(dir, "csi.sock"),
		state: filepath.Join(dir, "state"), mnt: filepath.Join(dir, "mnt"),
		volumes: map[string][32]byte{}, volNames: map[string]string{}, snaps: map[string][32]byte{}, snapNames: map[string]string{}}
	if out, err := exec.Command("go", "build", "-o", h.bin, "../../cmd/hostpathplugin").CombinedOutput(); err != nil {
		t.Fatalf("build: %v %s", err, out)
	}
	t.Cleanup(func() {
		if h.cmd != nil && h.cmd.ProcessState == nil {
			h.cmd.Process.Kill()
			h.cmd.Wait()
		}
		testutil.UnmountUnder(t, dir)
	})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	ctx := context.Background()
	h.start()
	kills, inside := 0, 0
	for i := 0; i < iterations; i++ {
		o := h.pick(r)
		errc := make(chan error, 1)
		go func() { errc <- o.run(ctx) }()
		// Kill inside the operation (a few ms in) or after it.
		time.Sleep(time.Duration(r.IntN(12000)) * time.Microsecond)
		h.kill()
		kills++
		if err := <-errc; err != nil {
			inside++ // the kill cut the operation short
		}
		h.start()
		// The CO retries what was in flight; it must succeed.
		if err := o.run(ctx); err != nil {
			t.Fatalf("iteration %d: retry of %q after SIGKILL: %v", i, o.desc, err)
		}
		// Every volume published after every fifth kill and the last.
		h.verify(ctx, i%5 == 4 || i == iterations-1)
	}
	// Delete everything: nothing may be left.
	for _, s := range keys(h.snaps) {
		if _, err := h.ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s}); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range keys(h.volumes) {
		if _, err := h.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v}); err != nil {
			t.Fatal(err)
		}
	}
	h.kill()
	h.start()
	h.kill()
	for _, sub := range []string{"volumes", "snapshots", "tmp", "meta/volumes", "meta/snapshots"} {
		entries, _ := os.ReadDir(filepath.Join(h.state, sub))
		// The marker that says the volumes directory is home stays, and
		// so does the downgrade guard of a driver that did not stop
		// cleanly (it was killed).
		entries = slices.DeleteFunc(entries, func(e os.DirEntry) bool {
			return e.Name() == ".hostpath-volumes" || sub == "tmp" && e.Name() == ".write-probe"
		})
		if len(entries) != 0 {
			t.Errorf("%s not empty after deleting everything: %v", sub, entries)
		}
	}
	bound, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range bound {
		if b, _ := os.ReadFile(bf); bytes.HasPrefix(b, []byte(dir)) {
			t.Errorf("loop device left: %s", b)
		}
	}
	t.Logf("%d SIGKILLs (%d inside an operation), every restart consistent", kills, inside)
	if inside == 0 {
		t.Error("no kill landed inside an operation")
	}
}
