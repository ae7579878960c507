package csi

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestRestoreFromAnotherNodeUnderFlood: while pods that can reach node
// a's transfer port hold hundreds of connections there that never
// authenticate (idle, or a ClientHello cut short, from one address and
// from many), node b clones a volume of node a's: it gets every byte, in
// far less than an attacker's handshake deadline (30 s here, so that a
// clone slowed by a busy machine is never mistaken for one that waited
// out an attacker).
func TestRestoreFromAnotherNodeUnderFlood(t *testing.T) {
	a, b, _ := newPeerPair(t, "")
	a.stop()
	a.handshake = 30 * time.Second
	a.serve(t)
	src := mustCreate(t, a.d, "src", 100<<20)
	fillVolume(t, volumeDir(a.d, src.GetVolumeId()))
	want := treeSum(t, volumeDir(a.d, src.GetVolumeId()))
	// The clone's own time, without a flood, for the log.
	start := time.Now()
	if _, err := b.d.CreateVolume(ctx, fromVolume("baseline", src.GetVolumeId(), 100<<20)); err != nil {
		t.Fatal(err)
	}
	baseline := time.Since(start)
	for i, flood := range []struct {
		peers, each int
		hello       bool
	}{{1, 300, false}, {1, 300, true}, {40, 12, false}} {
		open, stop := testutil.Flood(a.addr, flood.peers, flood.each, flood.hello)
		time.Sleep(500 * time.Millisecond)
		start := time.Now()
		v, err := b.d.CreateVolume(ctx, fromVolume(filepath.Base(t.Name())+string(rune('a'+i)), src.GetVolumeId(), 100<<20))
		took := time.Since(start)
		n := open()
		stop()
		if err != nil {
			t.Fatalf("clone from node a under %d unauthenticated connections: %v", n, err)
		}
		if got := treeSum(t, volumeDir(b.d, v.GetVolume().GetVolumeId())); got != want {
			t.Fatal("the clone differs from its source")
		}
		if took > 20*time.Second {
			t.Fatalf("the clone under %d unauthenticated connections took %v (%v without them): it waited for attackers' handshakes", n, took, baseline)
		}
		t.Logf("cloned from node a in %v under %d unauthenticated connections (%v without them)", took.Round(time.Millisecond), n, baseline.Round(time.Millisecond))
	}
}
