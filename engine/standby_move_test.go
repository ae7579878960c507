package engine

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestStandbyMove: a stage on the standby's node while the primary is up
// and has the volume unstaged moves it: the standby holds every byte the
// primary held (nothing is lost), at the next epoch, and the old primary
// becomes its standby, holding the same generation. Moved back, only the
// blocks written meanwhile travel, and the epochs go on rising.
func TestStandbyMove(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	for _, e := range nodes {
		e.SetFences(func(context.Context, string) (string, error) { return "", nil })
	}
	v := pulledCopy(t, a, b, "pvc-moved", 32<<20, 4<<20)
	// Written after the last pull, before the pod stopped: it must move
	// too.
	writeAt(t, a.VolumeDataPath(v), 8<<20, 1<<20, false)
	want, _ := os.ReadFile(a.VolumeDataPath(v))

	if err := b.takeOver(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	onB, ok := b.Records.Volumes.Get(v.ID)
	if !ok || onB.Epoch != 1 || onB.Standby != "node-1" {
		t.Fatalf("on node-2 after the move: %+v, want the volume at epoch 1, node-1 its standby", onB)
	}
	if got, _ := os.ReadFile(b.VolumeDataPath(onB)); !bytes.Equal(got, want) {
		t.Fatal("the moved volume lacks what the primary held when it handed it over")
	}
	if _, ok := a.Records.Volumes.Get(v.ID); ok {
		t.Error("node-1 still holds the volume it handed over")
	}
	s, ok := a.Records.Standbys.Get(v.ID)
	if !ok || s.Primary != "node-2" || s.Epoch != 1 {
		t.Fatalf("node-1's copy after the move: %+v (%v), want node-2 its primary, epoch 1", s, ok)
	}
	if _, gen, err := a.StandbyGeneration(v.ID); err != nil || gen == "" {
		t.Fatalf("node-1 holds no generation after the move: %v", err)
	} else if got, _ := os.ReadFile(gen); !bytes.Equal(got, want) {
		t.Fatal("node-1's generation differs from what it handed over")
	}
	if _, other := a.OtherNode(v.ID); !other {
		t.Error("node-1 still takes the volume for its own")
	}

	// Written on node-2, then moved back: only the change travels.
	writeAt(t, b.VolumeDataPath(onB), 16<<20, 1<<20, false)
	want, _ = os.ReadFile(b.VolumeDataPath(onB))
	st, err := a.CatchUp(bg, v.ID)
	if err != nil || st.Bytes != 1<<20 {
		t.Fatalf("node-1 catching up from node-2: %+v, %v; want the 1 MiB written there", st, err)
	}
	if err := a.takeOver(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	back, ok := a.Records.Volumes.Get(v.ID)
	if !ok || back.Epoch != 2 || back.Standby != "node-2" {
		t.Fatalf("on node-1 after the move back: %+v, want epoch 2, node-2 its standby", back)
	}
	if got, _ := os.ReadFile(a.VolumeDataPath(back)); !bytes.Equal(got, want) {
		t.Fatal("the volume moved back lacks what node-2 held")
	}
	if s, ok := b.Records.Standbys.Get(v.ID); !ok || s.Primary != "node-1" || s.Epoch != 2 {
		t.Fatalf("node-2's copy after the move back: %+v (%v)", s, ok)
	}
}

// TestStandbyHanded: a node that handed a volume over and was not told it
// is held refuses to stage it (ErrNotFenced, naming the node it went to),
// unless that node is fenced: then it takes the volume back at an epoch
// above any the other could have reached.
func TestStandbyHanded(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a := nodes["node-1"]
	v := withStandby(t, a, "pvc-handed", 8<<20, nil)
	v.HandedTo = "node-2"
	if err := a.Records.Volumes.Put(v); err != nil {
		t.Fatal(err)
	}
	fence := ""
	a.SetFences(func(context.Context, string) (string, error) { return fence, nil })
	if err := a.takeOver(bg, v.ID); !errors.Is(err, ErrNotFenced) {
		t.Fatalf("a stage of a volume handed over: %v, want ErrNotFenced", err)
	}
	fence = "node node-2's Node is deleted"
	if err := a.takeOver(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Records.Volumes.Get(v.ID); got.HandedTo != "" || got.Epoch != 2 {
		t.Fatalf("taken back: %+v, want not handed, epoch 2", got)
	}
}

// TestStandbyReturn: a primary whose standby promoted the volume while it
// was fenced learns it at its next stage (the standby holds the volume at
// a higher epoch), drops what it wrote past the promoted generation, and
// takes the volume back by a move: it then holds what was written on the
// other node, and only the blocks written there travelled.
func TestStandbyReturn(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	a.SetFences(func(context.Context, string) (string, error) { return "", nil })
	b.SetFences(func(_ context.Context, node string) (string, error) {
		return node + " carries the out-of-service taint", nil
	})
	v := pulledCopy(t, a, b, "pvc-return", 32<<20, 4<<20)
	writeAt(t, a.VolumeDataPath(v), 8<<20, 1<<20, false) // past the last pull: lost with the fence

	// node-1 fenced: node-2 promotes; its pod writes there.
	if err := b.takeOver(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	onB, _ := b.Records.Volumes.Get(v.ID)
	writeAt(t, b.VolumeDataPath(onB), 16<<20, 1<<20, false)
	want, _ := os.ReadFile(b.VolumeDataPath(onB))

	// node-1 back, its pod with it: superseded, it moves the volume back.
	if err := a.takeOver(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	back, ok := a.Records.Volumes.Get(v.ID)
	if !ok || back.Epoch != 2 || back.HandedTo != "" {
		t.Fatalf("on node-1 after its return: %+v (%v), want the volume at epoch 2", back, ok)
	}
	if got, _ := os.ReadFile(a.VolumeDataPath(back)); !bytes.Equal(got, want) {
		t.Fatal("node-1 does not hold what node-2 held: its own write past the promotion must be gone, node-2's there")
	}
	if s, ok := b.Records.Standbys.Get(v.ID); !ok || s.Primary != "node-1" || s.Epoch != 2 {
		t.Fatalf("node-2 after the return: %+v (%v), want it node-1's standby at epoch 2", s, ok)
	}
	// What node-1 wrote past the promotion is set aside, not removed: the
	// promotion is the other node's word.
	if aside, _ := filepath.Glob(filepath.Join(standbyDir(a.Paths.Root, v.ID), "superseded-*.img")); len(aside) != 1 {
		t.Errorf("node-1's superseded data: %v, want it set aside", aside)
	}
	b.standby.mu.Lock()
	sent := b.standby.served[v.ID].sent
	b.standby.mu.Unlock()
	if sent != 1<<20 {
		t.Errorf("node-2 sent %d bytes to move the volume back, want the 1 MiB written there (of %d)", sent, v.CapacityBytes)
	}
}

// TestStandbyReturnUnstaged: a primary back from a fence with no pod of
// the volume learns from its standby, on its own (RunStandbys asks), that
// it was superseded, becomes the standby, and catches up by the blocks
// written on the new primary only.
func TestStandbyReturnUnstaged(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	b.SetFences(func(_ context.Context, node string) (string, error) { return node + " is out of service", nil })
	v := pulledCopy(t, a, b, "pvc-back", 32<<20, 4<<20)
	if err := b.takeOver(bg, v.ID); err != nil {
		t.Fatal(err)
	}
	onB, _ := b.Records.Volumes.Get(v.ID)
	writeAt(t, b.VolumeDataPath(onB), 16<<20, 1<<20, false)

	a.checkSuperseded(bg)
	if _, ok := a.Records.Volumes.Get(v.ID); ok {
		t.Fatal("node-1 still holds the volume its standby promoted")
	}
	st, err := a.CatchUp(bg, v.ID)
	if err != nil || st.Bytes != 1<<20 {
		t.Fatalf("node-1 catching up as the standby: %+v, %v; want the 1 MiB written on node-2", st, err)
	}
	_, gen, _ := a.StandbyGeneration(v.ID)
	got, _ := os.ReadFile(gen)
	want, _ := os.ReadFile(b.VolumeDataPath(onB))
	if !bytes.Equal(got, want) {
		t.Fatal("node-1's generation differs from the volume on node-2")
	}
}

// TestStandbyHandedNoticeLost: a move whose notice to the old primary
// never came (the new owner promoted, the old one stays handed) is
// finished by the old primary's own asking (checkSuperseded): it becomes
// the standby.
func TestStandbyHandedNoticeLost(t *testing.T) {
	nodes, _ := standbyNodes(t, "node-1", "node-2")
	a, b := nodes["node-1"], nodes["node-2"]
	v := withStandby(t, a, "pvc-lost-notice", 16<<20, nil)
	keepCopy(t, b, v, 0)
	writeAt(t, a.VolumeDataPath(v), 0, 1<<20, false)
	if _, err := b.pullGeneration(bg, v.ID, SourceHandover); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PromoteStandby(bg, v.ID, "handed over by node node-1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Records.Volumes.Get(v.ID); got.HandedTo != "node-2" {
		t.Fatalf("node-1 after the handover: %+v, want it handed to node-2", got)
	}
	a.checkSuperseded(bg)
	if _, ok := a.Records.Volumes.Get(v.ID); ok {
		t.Fatal("node-1 still holds the volume it handed over")
	}
	if s, ok := a.Records.Standbys.Get(v.ID); !ok || s.Primary != "node-2" {
		t.Fatalf("node-1's copy: %+v (%v), want node-2 its primary", s, ok)
	}
	if st, err := a.CatchUp(bg, v.ID); err != nil || st.Bytes != 0 {
		t.Fatalf("node-1 catching up: %+v, %v; want nothing new", st, err)
	}
}
