package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/transfer"
)

// directPeers reaches other engines of the test in process, as the
// transfer would (who asks is the engine's node), with an optional cut of
// every stream after cutAt bytes.
type directPeers struct {
	self  string
	nodes map[string]*Engine
	cutAt int64
}

func (p *directPeers) Open(ctx context.Context, tag, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, string, error) {
	for name, e := range p.nodes {
		if NodeTag(name) != tag || name == p.self {
			continue
		}
		if kind == SourceEpoch {
			if err := e.AuthorizeEpoch(p.self, id); err != nil {
				return transfer.Meta{}, nil, name, err
			}
		}
		if kind == SourceStandby || kind == SourceHandover || kind == SourceHanded {
			if err := e.AuthorizeStandby(p.self, id); err != nil {
				return transfer.Meta{}, nil, name, err
			}
		}
		m, rc, err := e.TransferSource().Open(ctx, p.self, kind, id, statOnly)
		if rc != nil && p.cutAt > 0 {
			rc = &cutReader{ReadCloser: rc, left: p.cutAt}
		}
		return m, rc, name, err
	}
	return transfer.Meta{}, nil, "", fmt.Errorf("%w: no node has tag %s", transfer.ErrUnreachable, tag)
}

type cutReader struct {
	io.ReadCloser
	left int64
}

func (r *cutReader) Read(b []byte) (int, error) {
	if r.left <= 0 {
		return 0, fmt.Errorf("%w: cut by the test", transfer.ErrIncomplete)
	}
	n, err := r.ReadCloser.Read(b[:min(int64(len(b)), r.left)])
	r.left -= int64(n)
	return n, err
}

// standbyNodes starts engines for names, each with its state dir on an
// XFS of its own (blocks shared by reflink, as a standby pool's are), each
// reaching the others.
func standbyNodes(t *testing.T, names ...string) (map[string]*Engine, map[string]*directPeers) {
	t.Helper()
	testutil.RequireRoot(t)
	nodes, peers := map[string]*Engine{}, map[string]*directPeers{}
	for _, name := range names {
		cfg := testConfig(t)
		cfg.NodeID = name
		cfg.StateDir = filepath.Join(testfs.FileSystem(t, run, "xfs", 300<<20, nil, ""), "state")
		nodes[name] = openEngine(t, cfg)
	}
	for name, e := range nodes {
		peers[name] = &directPeers{self: name, nodes: nodes}
		e.SetPeers(peers[name])
	}
	return nodes, peers
}

// writeAt writes n random bytes (never zero) at off of the file at path,
// or zeros them (a hole) when zero.
func writeAt(t *testing.T, path string, off, n int64, zero bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if zero {
		if err := fsops.PunchHole(int(f.Fd()), off, n); err != nil {
			t.Fatal(err)
		}
		return
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32() | 1)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// withStandby makes a block volume of size on a (node-1) whose record
// names node-2 as its standby, with the class parameters params.
func withStandby(t *testing.T, a *Engine, name string, size int64, params map[string]string) VolumeRecord {
	t.Helper()
	v := makeVolume(t, a, name, AccessBlock, size)
	v.Standby, v.Parameters = "node-2", params
	if err := a.Records.Volumes.Put(v); err != nil {
		t.Fatal(err)
	}
	return v
}

// pulledCopy makes a block volume of size on a (node-1) with its standby
// on b (node-2), written from its start with written bytes, and has b pull
// it once: the copy holds one generation.
func pulledCopy(t *testing.T, a, b *Engine, name string, size, written int64) VolumeRecord {
	t.Helper()
	v := withStandby(t, a, name, size, nil)
	keepCopy(t, b, v, 0)
	writeAt(t, a.VolumeDataPath(v), 0, written, false)
	if _, err := b.CatchUp(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	return v
}

// keepCopy records on b (node-2) that it keeps a copy of node-1's v.
func keepCopy(t *testing.T, b *Engine, v VolumeRecord, every time.Duration) {
	t.Helper()
	if _, err := b.AddStandby(StandbySpec{Volume: v.ID, Primary: "node-1", Access: AccessBlock, Interval: every}); err != nil {
		t.Fatal(err)
	}
}

// TestStandbyCatchUp: a standby of a block volume holds, after each pull,
// a generation equal byte for byte to the volume at its cut; the first
// pull brings the data, each later one only the blocks changed (and
// zeros as holes); a pull cut mid-stream leaves the held generation whole
// and the next pull goes on from it; the copy is found again after a
// restart.
func TestStandbyCatchUp(t *testing.T) {
	nodes, peers := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := withStandby(t, a, "pvc-standby", 64<<20, nil)
	if _, err := b.AddStandby(StandbySpec{Volume: v.ID, Primary: "node-2", Access: AccessBlock}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a standby of a volume named for another node than its own: %v, want ErrInvalid", err)
	}
	keepCopy(t, b, v, 0)
	img := a.VolumeDataPath(v)
	same := func(step string, want uint64) {
		t.Helper()
		g, path, err := b.StandbyGeneration(v.ID)
		if err != nil || g != want {
			t.Fatalf("%s: generation %d (%v), want %d", step, g, err, want)
		}
		got, _ := os.ReadFile(path)
		exp, _ := os.ReadFile(img)
		if !bytes.Equal(got, exp) {
			t.Fatalf("%s: generation %d differs from the volume", step, g)
		}
	}
	for i, step := range []struct {
		name      string
		write     func()
		wantBase  uint64
		wantBytes int64
		wantGen   uint64
	}{
		{"the first pull brings the data", func() { writeAt(t, img, 0, 4<<20, false) }, 0, 4 << 20, 1},
		{"a block written: only it comes", func() { writeAt(t, img, 10<<20, 4096, false) }, 1, 4096, 2},
		{"data zeroed: a hole, no bytes", func() { writeAt(t, img, 0, 1<<20, true) }, 2, 0, 3},
		{"nothing changed", func() {}, 3, 0, 4},
	} {
		step.write()
		st, err := b.CatchUp(bg, v.ID)
		if err != nil {
			t.Fatalf("step %d, %s: %v", i, step.name, err)
		}
		if st.Base != step.wantBase || st.Bytes != step.wantBytes || st.Generation != step.wantGen {
			t.Errorf("%s: %+v, want base %d, %d bytes, generation %d", step.name, st, step.wantBase, step.wantBytes, step.wantGen)
		}
		same(step.name, step.wantGen)
	}

	// A pull cut mid-stream: the held generation stays, whole.
	writeAt(t, img, 20<<20, 2<<20, false)
	peers["node-2"].cutAt = 1 << 20
	if _, err := b.CatchUp(bg, v.ID); err == nil {
		t.Fatal("a cut pull made a generation")
	}
	peers["node-2"].cutAt = 0
	g, path, _ := b.StandbyGeneration(v.ID)
	if g != 4 {
		t.Fatalf("after a cut pull the standby holds generation %d, want 4", g)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.tmp")); len(left) > 0 {
		t.Errorf("a cut pull left %v", left)
	}
	st, err := b.CatchUp(bg, v.ID)
	if err != nil || st.Base != 4 || st.Bytes != 2<<20 {
		t.Fatalf("the pull after a cut one: %+v, %v; want base 4 and the 2 MiB written", st, err)
	}
	same("after a cut pull", st.Generation)

	// Found again after a restart.
	cfg := b.Config
	b.Close()
	b = openEngine(t, cfg)
	b.SetPeers(peers["node-2"])
	nodes["node-2"] = b
	same("after a restart", st.Generation)

	// Gone with the volume on the primary; gone when dropped on the
	// standby.
	deleteVolume(t, a, v.ID)
	if _, err := os.Stat(standbyDir(a.Paths.Root, v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the primary's cuts outlive the volume: %v", err)
	}
	if err := b.DropStandby(v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(standbyDir(b.Paths.Root, v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the standby's generations outlive its record: %v", err)
	}
}

// TestStandbyServedOnlyToItsNode: a volume's changed blocks go only to the
// node its own record names as its standby; a node that records itself as
// a standby of a volume without one, or of another node's standby, gets
// nothing.
func TestStandbyServedOnlyToItsNode(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2", "node-3")
	a := nodes["node-1"]
	with := withStandby(t, a, "pvc-with", 8<<20, nil)
	without := makeVolume(t, a, "pvc-without", AccessBlock, 8<<20)
	for _, tc := range []struct {
		name, node, vol string
		ok              bool
	}{
		{"its standby", "node-2", with.ID, true},
		{"another node", "node-3", with.ID, false},
		{"a volume with no standby", "node-2", without.ID, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := nodes[tc.node]
			if _, err := n.AddStandby(StandbySpec{Volume: tc.vol, Primary: "node-1", Access: AccessBlock}); err != nil {
				t.Fatal(err)
			}
			_, err := n.CatchUp(bg, tc.vol)
			if (err == nil) != tc.ok {
				t.Fatalf("pull: %v, want ok %v", err, tc.ok)
			}
			if !tc.ok && !errors.Is(err, transfer.ErrRefused) {
				t.Errorf("refused with %v, want ErrRefused", err)
			}
		})
	}
}

// TestStandbyRuns: RunStandbys keeps a copy caught up on its own, at its
// interval, and says how it went.
func TestStandbyRuns(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := withStandby(t, a, "pvc-runs", 16<<20, nil)
	keepCopy(t, b, v, time.Second)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan struct{})
	go func() { defer close(done); b.RunStandbys(ctx, nil) }()
	defer func() { cancel(); <-done }()
	img := a.VolumeDataPath(v)
	caughtUp := func() bool {
		_, path, err := b.StandbyGeneration(v.ID)
		if err != nil || path == "" {
			return false
		}
		got, _ := os.ReadFile(path)
		exp, _ := os.ReadFile(img)
		return bytes.Equal(got, exp)
	}
	writeAt(t, img, 0, 1<<20, false)
	testutil.WaitFor(t, 30*time.Second, "the standby never held the first write", caughtUp)
	first, _, _ := b.StandbyGeneration(v.ID)
	writeAt(t, img, 8<<20, 1<<20, false)
	testutil.WaitFor(t, 30*time.Second, "the standby never held the second write", caughtUp)
	if g, _, _ := b.StandbyGeneration(v.ID); g <= first {
		t.Errorf("generation %d after %d", g, first)
	}
	st, ok := b.StandbyStatusOf(v.ID)
	if !ok || st.LastErr != nil || st.Bytes < 2<<20 || st.Made.IsZero() {
		t.Errorf("status %+v (%v), want the last pull good and at least 2 MiB received", st, ok)
	}
}

// TestStandbyHealth: a volume whose standby has not caught up for three
// intervals says so (node, age), and stops saying so once the standby has
// pulled; /metrics shows what was sent to it and its lag.
func TestStandbyHealth(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := withStandby(t, a, "pvc-health", 16<<20, map[string]string{ParamStandby: "1", ParamStandbyInterval: "1s"})
	keepCopy(t, b, v, time.Second)
	var behind error
	testutil.WaitFor(t, 30*time.Second, "a standby that never pulled was never reported behind", func() bool {
		behind = a.StandbyBehind(v)
		return behind != nil
	})
	if !strings.Contains(behind.Error(), "node-2") {
		t.Errorf("behind: %v, want it to name node-2", behind)
	}
	writeAt(t, a.VolumeDataPath(v), 0, 1<<20, false)
	for range 2 { // the second pull says which generation the standby holds
		if _, err := b.CatchUp(bg, v.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.StandbyBehind(v); err != nil {
		t.Errorf("after two pulls: %v", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.StandbyCollector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if got["hostpath_standby_sent_bytes_total"] < 1<<20 || got["hostpath_standby_lag_seconds"] > 30 {
		t.Errorf("metrics %v: want at least the 1 MiB written sent, and a lag of seconds", got)
	}
}

// TestStandbyBandwidth: a node's pulls go no faster than
// --standby-bandwidth (a lower bound on the time, which a slow machine
// only lengthens).
func TestStandbyBandwidth(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	b.Config.StandbyBandwidth = 2 << 20
	v := withStandby(t, a, "pvc-paced", 16<<20, nil)
	keepCopy(t, b, v, 0)
	writeAt(t, a.VolumeDataPath(v), 0, 5<<20, false)
	start := time.Now()
	st, err := b.CatchUp(bg, v.ID)
	took := time.Since(start)
	if err != nil || st.Bytes != 5<<20 {
		t.Fatalf("%+v, %v", st, err)
	}
	// 5 MiB at 2 MiB/s, the first MiB a burst: at least 2 s.
	if took < 2*time.Second {
		t.Errorf("5 MiB pulled in %v at 2 MiB/s", took)
	}
	t.Logf("5 MiB pulled in %v at --standby-bandwidth=2Mi", took.Round(10*time.Millisecond))
}
