package csi

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/transfer"
)

// slowPeers lets each stream through at about rate bytes a second and
// counts the streams opened.
type slowPeers struct {
	engine.Peers
	rate    int64
	streams atomic.Int64
}

func (s *slowPeers) Open(ctx context.Context, tag, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, string, error) {
	m, rc, node, err := s.Peers.Open(ctx, tag, kind, id, statOnly)
	if rc != nil {
		s.streams.Add(1)
		rc = &slowReader{ReadCloser: rc, rate: s.rate}
	}
	return m, rc, node, err
}

type slowReader struct {
	io.ReadCloser
	rate int64
}

func (r *slowReader) Read(b []byte) (int, error) {
	b = b[:min(len(b), 64<<10)]
	time.Sleep(time.Duration(int64(len(b)) * int64(time.Second) / r.rate))
	return r.ReadCloser.Read(b)
}

// TestPullOutlivesTheRequest: a clone from another node that takes longer
// than the request's deadline (the provisioner's --timeout) goes on past
// it: the request, and every retry while it runs, is answered Aborted
// saying the volume is being pulled (and how far), and once it is done a
// retry returns the volume, every byte there, the source streamed once.
// In the first version the pull was cancelled at the deadline and each
// retry started from nothing, so a pull longer than the timeout never
// finished. A pull cut by the driver's stop leaves nothing behind.
func TestPullOutlivesTheRequest(t *testing.T) {
	a, b, bp := newPeerPair(t, "")
	src := mustCreate(t, a.d, "src", 100<<20)
	dir := volumeDir(a.d, src.GetVolumeId())
	data := make([]byte, 24<<20) // random: the stream is as big compressed
	rand.Read(data)
	os.WriteFile(filepath.Join(dir, "data"), data, 0o644)
	want := treeSum(t, dir)
	slow := &slowPeers{Peers: bp, rate: 8 << 20} // about 3 s for the data
	b.d.eng.SetPeers(slow)

	var answers []string
	var cloneID string
	start := time.Now()
	for {
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		v, err := b.d.CreateVolume(rctx, fromVolume("clone", src.GetVolumeId(), 100<<20))
		cancel()
		if err == nil {
			cloneID = v.GetVolume().GetVolumeId()
			if got := treeSum(t, volumeDir(b.d, v.GetVolume().GetVolumeId())); got != want {
				t.Fatal("the pulled volume differs from its source")
			}
			break
		}
		switch {
		case status.Code(err) == codes.DeadlineExceeded:
			// Its deadline passed before it could answer (a busy
			// machine): the provisioner asks again, as here.
		case status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "being pulled"):
			t.Fatalf("a request while the pull runs: %v, want Aborted saying it is being pulled", err)
		default:
			answers = append(answers, status.Convert(err).Message())
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the pull did not finish in 30 s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := slow.streams.Load(); n != 1 {
		t.Fatalf("the source was streamed %d times, want once", n)
	}
	if len(answers) < 2 || !strings.Contains(strings.Join(answers, "\n"), "moved)") {
		t.Fatalf("answers while pulling: %q, want several, one with the bytes moved", answers)
	}
	t.Logf("pulled in %v across %d requests", time.Since(start).Round(10*time.Millisecond), len(answers)+1)

	// A pull the driver's stop cuts leaves nothing.
	slow.rate = 1 << 20
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := b.d.CreateVolume(rctx, fromVolume("cut", src.GetVolumeId(), 100<<20))
	cancel()
	if c := status.Code(err); c != codes.Aborted && c != codes.DeadlineExceeded {
		t.Fatalf("a slow pull: %v", err)
	}
	if err := b.d.Close(); err != nil {
		t.Fatal(err)
	}
	if v, ok := volumeNamed(b.d, "cut"); ok {
		t.Fatalf("the cut pull left its record: %+v", v)
	}
	for _, dir := range []string{volumesDir(b.d), tmpDir(b.d)} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") && e.Name() != cloneID {
				t.Fatalf("the cut pull left %s in %s", e.Name(), dir)
			}
		}
	}
}

// TestPullAbandoned: a pull nobody asks about after its request ended
// (the claim deleted, the provisioner gone) is cancelled after
// PullAbandonAfter, leaving nothing; a later request starts it again.
// Before, it ran to its end however long that took.
func TestPullAbandoned(t *testing.T) {
	a, b, bp := newPeerPair(t, "")
	b.d.eng.Config.PullAbandonAfter = 300 * time.Millisecond
	src := mustCreate(t, a.d, "src", 100<<20)
	data := make([]byte, 24<<20)
	rand.Read(data)
	os.WriteFile(filepath.Join(volumeDir(a.d, src.GetVolumeId()), "data"), data, 0o644)
	slow := &slowPeers{Peers: bp, rate: 1 << 20} // 24 s for the data
	b.d.eng.SetPeers(slow)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := b.d.CreateVolume(rctx, fromVolume("abandoned", src.GetVolumeId(), 100<<20))
	cancel()
	if status.Code(err) != codes.Aborted {
		t.Fatalf("a slow pull: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, recorded := volumeNamed(b.d, "abandoned")
		if !recorded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pull nobody asked about still runs after 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ents, _ := os.ReadDir(tmpDir(b.d))
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("the abandoned pull left %s", e.Name())
		}
	}
	// Asked again, it starts again (the abandoned pull's last steps may
	// still be letting go for a moment: asked until it starts, 10 s).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		_, err = b.d.CreateVolume(rctx, fromVolume("abandoned", src.GetVolumeId(), 100<<20))
		cancel()
		if status.Code(err) == codes.Aborted && slow.streams.Load() == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("asked again: %v after %d streams, want Aborted and a second stream", err, slow.streams.Load())
		}
	}
}
