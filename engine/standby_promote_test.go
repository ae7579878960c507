package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/transfer"
)

// TestStandbyPromotion: the standby of a volume whose primary is fenced
// makes its newest generation the volume, under the same id, with the next
// fencing epoch and the old primary as its standby; it holds what the
// primary held at the last cut the standby pulled (writes after it are
// the interval's loss), keeps that cut as the old primary's base, and lets
// go of the copy. Without a fence, a copy, or a generation, it refuses.
func TestStandbyPromotion(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := withStandby(t, a, "pvc-promoted", 32<<20, nil)
	img := a.VolumeDataPath(v)
	for _, tc := range []struct {
		name, id, fence string
		want            error
	}{
		{"no fence", v.ID, "", ErrInvalid},
		{"no copy here", v.ID, "node-1 is out of service", ErrNotFound},
	} {
		if _, err := b.PromoteStandby(bg, tc.id, tc.fence); !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	keepCopy(t, b, v, 0)
	if _, err := b.PromoteStandby(bg, v.ID, "node-1 is out of service"); !errors.Is(err, ErrDataMissing) {
		t.Fatalf("a copy that never pulled: %v, want ErrDataMissing", err)
	}
	writeAt(t, img, 0, 2<<20, false)
	if _, err := b.CatchUp(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	writeAt(t, img, 4<<20, 1<<20, false)
	st, err := b.CatchUp(bg, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	atCut, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	writeAt(t, img, 8<<20, 1<<20, false) // after the last pull: lost with the primary

	p, err := b.PromoteStandby(bg, v.ID, "node-1 is out of service")
	if err != nil {
		t.Fatal(err)
	}
	if p.ID != v.ID || p.Epoch != 1 || p.Standby != "node-1" || p.Phase != PhaseReady || p.CapacityBytes != v.CapacityBytes || p.AccessType != AccessBlock {
		t.Fatalf("promoted: %+v; want %s ready, epoch 1, node-1 its standby, %d bytes", p, v.ID, v.CapacityBytes)
	}
	if got, err := os.ReadFile(b.VolumeDataPath(p)); err != nil || !bytes.Equal(got, atCut) {
		t.Fatalf("the promoted volume does not hold the volume as its last cut was (%v)", err)
	}
	if _, other := b.OtherNode(v.ID); other {
		t.Error("node-2 takes the promoted volume for another node's")
	}
	if _, ok := b.Records.Standbys.Get(v.ID); ok {
		t.Error("the copy's record outlives the promotion")
	}
	dir := standbyDir(b.Paths.Root, v.ID)
	if gens, _ := generations(dir, "gen"); len(gens) != 0 {
		t.Errorf("generations %v outlive the promotion", gens)
	}
	if cut, err := os.ReadFile(filepath.Join(dir, cutName(st.Generation))); err != nil || !bytes.Equal(cut, atCut) {
		t.Errorf("the cut the old primary goes on from is not kept (%v)", err)
	}
	if again, err := b.PromoteStandby(bg, v.ID, "node-1 is out of service"); err != nil || again.Epoch != 1 {
		t.Errorf("promoted again: %+v, %v; want the same volume", again, err)
	}
}

// TestStandbyPromotionCut: a promotion cut by a crash before its volume's
// record is ready is taken back at the start and leaves the copy whole
// (the half-made volume's removal never takes the copy's directory); one
// cut after it is finished at the start.
func TestStandbyPromotionCut(t *testing.T) {
	nodes, peers := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := pulledCopy(t, a, b, "pvc-cut", 16<<20, 1<<20)
	g, gen, _ := b.StandbyGeneration(v.ID)
	held, _ := os.ReadFile(gen)
	restart := func() {
		t.Helper()
		cfg := b.Config
		b.Close()
		b = openEngine(t, cfg)
		b.SetPeers(peers["node-2"])
	}

	// Before the ready record: a creating record and a half-placed copy.
	half := VolumeRecord{ID: v.ID, Name: v.ID, CapacityBytes: v.CapacityBytes, AccessType: AccessBlock, Phase: PhaseCreating, Epoch: 1, Standby: "node-1"}
	if err := b.Records.Volumes.Put(half); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b.VolumeDataPath(half), held[:4096], 0o600); err != nil {
		t.Fatal(err)
	}
	restart()
	if _, ok := b.Records.Volumes.Get(v.ID); ok {
		t.Fatal("a half-made promotion is still recorded after the start")
	}
	if g2, gen2, err := b.StandbyGeneration(v.ID); err != nil || g2 != g {
		t.Fatalf("after a half-made promotion the copy holds generation %d (%v), want %d", g2, err, g)
	} else if got, _ := os.ReadFile(gen2); !bytes.Equal(got, held) {
		t.Fatal("the copy's generation changed")
	}

	// After it: the copy's record still there; the start lets go of it.
	p, err := b.PromoteStandby(bg, v.ID, "node-1's Node is deleted")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DetachAll(b.VolumeDataPath(p)) }) // the start attaches it
	s := StandbyRecord{Volume: v.ID, Primary: "node-1", Phase: PhaseReady, AccessType: AccessBlock}
	if err := b.Records.Standbys.Put(s); err != nil {
		t.Fatal(err)
	}
	restart()
	if _, ok := b.Records.Standbys.Get(v.ID); ok {
		t.Error("the start did not finish the promotion")
	}
	if got, err := os.ReadFile(b.VolumeDataPath(p)); err != nil || !bytes.Equal(got, held) {
		t.Errorf("the promoted volume after the start: %v", err)
	}
}

// TestStandbyTakeOver: a stage on the node of a volume's standby copy,
// while the primary has the volume staged, promotes the copy only when the
// primary is fenced; otherwise it is refused with ErrNotFenced, naming the
// primary and the fence that would let it go on. Where the node keeps no
// copy it does nothing.
func TestStandbyTakeOver(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := withStandby(t, a, "pvc-taken", 16<<20, nil)
	if err := b.takeOver(bg, v.ID); err != nil {
		t.Fatalf("no copy here: %v, want nothing done", err)
	}
	keepCopy(t, b, v, 0)
	writeAt(t, a.VolumeDataPath(v), 0, 1<<20, false)
	if _, err := b.CatchUp(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.takeOver(bg, v.ID); !errors.Is(err, ErrNotFenced) {
		t.Fatalf("outside a cluster: %v, want ErrNotFenced", err)
	}
	fence, fenceErr := "", error(nil)
	b.SetFences(func(_ context.Context, node string) (string, error) {
		if node != "node-1" {
			t.Errorf("asked whether %s is fenced, want node-1", node)
		}
		return fence, fenceErr
	})
	// Up, with the volume staged (its pod running): no move, no
	// promotion.
	t.Cleanup(func() { DetachAll(a.VolumeDataPath(v)) })
	if err := a.stageVolume(v, filepath.Join(t.TempDir(), "staging-a")); err != nil {
		t.Fatal(err)
	}
	err := b.takeOver(bg, v.ID)
	if !errors.Is(err, ErrNotFenced) || !strings.Contains(err.Error(), "node-1") || !strings.Contains(err.Error(), "out-of-service") {
		t.Fatalf("the primary up, the volume staged there: %v, want ErrNotFenced naming node-1 and the out-of-service taint", err)
	}
	fenceErr = errors.New("the API server is away")
	if err := b.takeOver(bg, v.ID); err == nil || errors.Is(err, ErrNotFenced) {
		t.Fatalf("fence unknown: %v, want the lookup's error", err)
	}
	if _, ok := b.Records.Volumes.Get(v.ID); ok {
		t.Fatal("promoted without a fence")
	}
	fence, fenceErr = "node node-1 carries the out-of-service taint", nil
	if err := b.takeOver(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	p, ok := b.Records.Volumes.Get(v.ID)
	if !ok || p.Epoch != 1 {
		t.Fatalf("after the fence: %+v, want the volume promoted", p)
	}
	t.Cleanup(func() { DetachAll(b.VolumeDataPath(p)) })
	if err := b.stageVolume(p, filepath.Join(t.TempDir(), "staging")); err != nil {
		t.Fatalf("staging the promoted volume: %v", err)
	}
	if err := b.takeOver(bg, v.ID); err != nil {
		t.Fatalf("a second stage: %v, want nothing to do", err)
	}
}

// hangingPeers never answers until the request is cancelled: a primary
// cut off mid-pull.
type hangingPeers struct{ asked chan struct{} }

func (p *hangingPeers) Open(ctx context.Context, tag, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, string, error) {
	p.asked <- struct{}{}
	<-ctx.Done()
	return transfer.Meta{}, nil, "node-1", fmt.Errorf("%w: %v", transfer.ErrUnreachable, ctx.Err())
}

// TestStandbyPromotionStopsAPull: a promotion does not wait for a pull
// hanging on the fenced primary: it stops it and goes on.
func TestStandbyPromotionStopsAPull(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := pulledCopy(t, a, b, "pvc-hung", 16<<20, 1<<20)
	hang := &hangingPeers{asked: make(chan struct{}, 1)}
	b.SetPeers(hang)
	pulled := make(chan error, 1)
	go func() { _, err := b.CatchUp(bg, v.ID); pulled <- err }()
	<-hang.asked
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := b.PromoteStandby(ctx, v.ID, "node-1 is out of service"); err != nil {
		t.Fatalf("a promotion while a pull hangs: %v after %v", err, time.Since(start))
	}
	if err := <-pulled; err == nil {
		t.Error("the hanging pull made a generation")
	}
}
