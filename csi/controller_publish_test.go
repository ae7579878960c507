package csi

import (
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// --maxvolumespernode holds under concurrent publishes of different
// volumes: each runs under its own volume's lock, so only a common step of
// counting and recording keeps two of them from taking the last slot.
func TestAttachLimitUnderConcurrency(t *testing.T) {
	cfg := testConfig(t)
	cfg.EnableAttach, cfg.MaxVolumesPerNode = true, 2
	d := newDriver(t, cfg)
	const n = 12
	ids := make([]string, n)
	for i := range ids {
		ids[i] = mustCreate(t, d, "pvc-attach-"+string(rune('a'+i)), 1<<20).GetVolumeId()
	}
	codesSeen := make([]codes.Code, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := d.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: cfg.NodeID, VolumeCapability: rwo})
			codesSeen[i] = status.Code(err)
		}()
	}
	close(start)
	wg.Wait()
	var ok, exhausted int
	for _, c := range codesSeen {
		switch c {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			exhausted++
		default:
			t.Errorf("unexpected code %v", c)
		}
	}
	if ok != 2 || exhausted != n-2 {
		t.Fatalf("%d publishes succeeded and %d were refused; the limit is 2 of %d", ok, exhausted, n)
	}
	if got := d.eng.AttachedCount(cfg.NodeID); got != 2 {
		t.Fatalf("%d volumes recorded attached, limit 2", got)
	}
}
