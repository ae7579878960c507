// Package stress runs many concurrent clients against the real binary with
// overlapping names and ids: only the errors the CSI spec allows, no
// deadlock, no goroutine or file descriptor growth, one volume per name.
package stress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

var rwo = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// Each call may be answered OK or Aborted (busy: the CO retries), and
// only with the other codes the spec gives for what a concurrent client
// may have done meanwhile. Identical CreateVolume requests never get
// AlreadyExists.
var (
	createOK     = []codes.Code{}
	deleteOK     = []codes.Code{codes.FailedPrecondition} // still published by another client
	snapshotOK   = []codes.Code{codes.AlreadyExists, codes.NotFound}
	deleteSnapOK = []codes.Code{}
	expandOK     = []codes.Code{codes.NotFound}
	publishOK    = []codes.Code{codes.NotFound}
	unpublishOK  = []codes.Code{}
	listOK       = []codes.Code{}
)

func metric(t *testing.T, addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func fds(pid int) int {
	e, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(e)
}

func TestConcurrentClients(t *testing.T) {
	testutil.RequireRoot(t)
	duration := 10 * time.Second
	if s := os.Getenv("STRESS_DURATION"); s != "" {
		duration, _ = time.ParseDuration(s)
	}
	const clients = 64
	dir := t.TempDir()
	bin := filepath.Join(dir, "hostpathplugin")
	if out, err := exec.Command("go", "build", "-race", "-o", bin, "../../cmd/hostpathplugin").CombinedOutput(); err != nil {
		t.Fatalf("build: %v %s", err, out)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	sock := filepath.Join(dir, "csi.sock")
	state := filepath.Join(dir, "state")
	cmd := exec.Command(bin, "--endpoint=unix://"+sock, "--nodeid=stress", "--statedir="+state, "--http-endpoint="+addr, "-v=0")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		testutil.UnmountUnder(t, dir)
		if strings.Contains(stderr.String(), "DATA RACE") || strings.Contains(stderr.String(), "panic") {
			t.Errorf("driver output:\n%s", stderr.String())
		}
	})
	conn, _ := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn.Close()
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := csi.NewIdentityClient(conn).Probe(context.Background(), &csi.ProbeRequest{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("driver did not start")
		}
	}
	// Warm up so the baseline counts include lazily started goroutines.
	ctrl.ListVolumes(context.Background(), &csi.ListVolumesRequest{})
	time.Sleep(200 * time.Millisecond)
	goroutines0, fds0 := metric(t, addr, "go_goroutines"), fds(cmd.Process.Pid)

	var ids sync.Map // volume ids seen
	var snaps sync.Map
	var calls, bad atomic.Int64
	check := func(what string, err error, also []codes.Code) {
		calls.Add(1)
		if c := status.Code(err); c != codes.OK && c != codes.Aborted && !slices.Contains(also, c) {
			bad.Add(1)
			t.Errorf("%s: %v", what, err)
		}
	}
	pick := func(m *sync.Map, r *rand.Rand) string {
		var out string
		n := 0
		m.Range(func(k, _ any) bool {
			n++
			if r.IntN(n) == 0 {
				out = k.(string)
			}
			return true
		})
		return out
	}
	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(c), 3))
			ctx := context.Background()
			for time.Now().Before(stop) {
				name := fmt.Sprintf("shared-%d", r.IntN(12)) // names overlap between clients
				switch r.IntN(8) {
				case 0, 1:
					resp, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{rwo}, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
					check("create", err, createOK)
					if err == nil {
						ids.Store(resp.GetVolume().GetVolumeId(), true)
					}
				case 2:
					if id := pick(&ids, r); id != "" {
						_, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
						check("delete", err, deleteOK)
					}
				case 3:
					if id := pick(&ids, r); id != "" {
						resp, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s-" + name, SourceVolumeId: id})
						check("snapshot", err, snapshotOK)
						if err == nil {
							snaps.Store(resp.GetSnapshot().GetSnapshotId(), true)
						}
					}
				case 4:
					if id := pick(&snaps, r); id != "" {
						_, err := ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
						check("delete snapshot", err, deleteSnapOK)
					}
				case 5:
					if id := pick(&ids, r); id != "" {
						_, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: int64(1+r.IntN(8)) << 20}})
						check("expand", err, expandOK)
					}
				case 6:
					if id := pick(&ids, r); id != "" {
						target := filepath.Join(dir, "t", strconv.Itoa(c))
						_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: rwo})
						check("publish", err, publishOK)
						// Like kubelet, retry an unpublish until it is done.
						for {
							_, err = node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
							check("unpublish", err, unpublishOK)
							if status.Code(err) != codes.Aborted {
								break
							}
							time.Sleep(time.Millisecond)
						}
					}
				default:
					_, err := ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 5})
					check("list", err, listOK)
				}
			}
		}(c)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(duration + 60*time.Second):
		t.Fatal("clients still blocked a minute after the end: deadlock")
	}
	// One volume per name, whatever the races.
	names := map[string]int{}
	entries, _ := os.ReadDir(filepath.Join(state, "meta", "volumes"))
	for _, e := range entries {
		var rec struct{ Name string }
		b, _ := os.ReadFile(filepath.Join(state, "meta", "volumes", e.Name()))
		json.Unmarshal(b, &rec)
		names[rec.Name]++
		if names[rec.Name] > 1 {
			t.Errorf("name %s has %d volumes", rec.Name, names[rec.Name])
		}
	}
	// The state journal holds the record files changed since its last
	// checkpoint open (at most 1024), by design: those are not a leak.
	// Finished streams close a little after their calls return, later on
	// a busy machine: the counts are read until they settle, for at most
	// 15 s, and judged then.
	held := metric(t, addr, "hostpath_state_files_awaiting_checkpoint")
	goroutines1, fds1 := metric(t, addr, "go_goroutines"), fds(cmd.Process.Pid)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		held = metric(t, addr, "hostpath_state_files_awaiting_checkpoint")
		goroutines1, fds1 = metric(t, addr, "go_goroutines"), fds(cmd.Process.Pid)
		if goroutines1 <= goroutines0+5 && float64(fds1)-held <= float64(fds0)+5 {
			break
		}
	}
	t.Logf("%d calls by %d clients in %v; goroutines %v -> %v, fds %d -> %d, of them %v record files awaiting the journal's checkpoint; %d disallowed errors",
		calls.Load(), clients, duration, goroutines0, goroutines1, fds0, fds1, held, bad.Load())
	if held < 0 || held > 1024 {
		t.Errorf("the journal holds %v record files open", held)
	}
	if goroutines1 > goroutines0+5 || float64(fds1)-held > float64(fds0)+5 {
		t.Errorf("growth: goroutines %v -> %v, fds %d -> %d", goroutines0, goroutines1, fds0, fds1)
	}
	if calls.Load() < clients {
		t.Errorf("only %d calls made", calls.Load())
	}
}
