package csi

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/iolimit"
)

// writerEnv makes the test binary a pod's writer (TestMain): it writes
// the file the variable names through the page cache, 1 MiB at a time,
// without syncing, from when it is told to start on stdin until it is
// killed.
const writerEnv = "HOSTPATH_DIRTY_WRITER"

func TestMain(m *testing.M) {
	if path := os.Getenv(writerEnv); path != "" {
		dirtyWriter(path) // writes until killed; returns only on a failure
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func dirtyWriter(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	bufio.NewReader(os.Stdin).ReadString('\n') // in its cgroup now
	chunk := make([]byte, 1<<20)
	for i := 0; ; i++ {
		rand.Read(chunk)
		if _, err := f.WriteAt(chunk, int64(i%200)<<20); err != nil {
			fmt.Println(err)
			return
		}
	}
}

// TestFreezeLiftsWriteLimits: on cgroup v2, io.max throttles a pod's
// writeback too, so the syncs before and inside a freeze would write the
// pod's dirty pages at its write limit (1 MiB/s here, with tens of MiB
// dirty: the snapshot would take minutes, or overrun --max-freeze every
// time). A snapshot of an image volume lifts its write limits from before
// the sync to the thaw: it is made in seconds while the pod writes, and
// the limits are back after. Cgroup v1 does not throttle writeback; the
// kernel guests run this on v2.
func TestFreezeLiftsWriteLimits(t *testing.T) {
	testutil.RequireRoot(t)
	h, err := iolimit.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatalf("no cgroup I/O controller: %v", err)
	}
	if !h.V2 {
		t.Skip("cgroup v1 throttles no writeback, so a freeze has no write limits to lift; the kernel guests (cgroup v2) run this test")
	}
	cfg := testConfig(t)
	cfg.EnableModifyVolume, cfg.CgroupMount, cfg.IOLimitInterval = true, "/sys/fs/cgroup", time.Hour
	cfg.MaxFreeze = 5 * time.Second
	d := newDriver(t, cfg)
	uid := podUID()
	podDir, ctrDir := testutil.PodCgroups(t, h.Root, h.V2, "cgroupfs", uid)
	id, target := publishedForPod(t, d, "limited-writes", 256<<20, map[string]string{engine.MutableWriteBPS: "1048576"}, uid)
	dev, err := iolimit.DeviceOf(target)
	if err != nil {
		t.Fatal(err)
	}
	limited := iolimit.Limits{WriteBytesPerSecond: 1 << 20}
	if got, err := h.Get(podDir, dev); err != nil || got != limited {
		t.Fatalf("the pod's limits: %+v (%v), want %+v", got, err, limited)
	}

	// The pod's writer, in its container's cgroup.
	data := filepath.Join(target, "dirty")
	w := exec.Command(os.Args[0], "-test.run=^$")
	w.Env = append(os.Environ(), writerEnv+"="+data)
	in, err := w.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Kill(); w.Wait() }) // before the unpublish
	if err := os.WriteFile(filepath.Join(ctrDir, "cgroup.procs"), []byte(strconv.Itoa(w.Process.Pid)), 0); err != nil {
		t.Fatalf("moving the writer into %s: %v", ctrDir, err)
	}
	in.Write([]byte("go\n"))
	in.Close()
	// Dirty far more than the limit writes back in --max-freeze.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if st, err := os.Stat(data); err == nil && st.Size() >= 48<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer dirtied less than 48 MiB in 2 minutes")
		}
	}
	start := time.Now()
	s, err := d.CreateSnapshot(ctx, snapReq("while-writing", id, nil))
	took := time.Since(start)
	if err != nil {
		t.Fatalf("a snapshot of a volume whose pod writes under a 1 MiB/s write limit, after %v: %v", took, err)
	}
	t.Cleanup(func() { d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshot().GetSnapshotId()}) })
	if took > 30*time.Second {
		t.Fatalf("the snapshot took %v: its syncs ran at the write limit", took)
	}
	if got, err := h.Get(podDir, dev); err != nil || got != limited {
		t.Fatalf("the pod's limits after the snapshot: %+v (%v), want %+v back", got, err, limited)
	}
	t.Logf("snapshot made in %v while the pod wrote under a 1 MiB/s write limit", took.Round(time.Millisecond))
}
