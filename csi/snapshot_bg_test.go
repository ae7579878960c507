package csi

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSnapshotOutlivesTheRequest: a snapshot longer than its request's
// deadline (the csi-snapshotter's --timeout, a minute by default) goes
// on past the request instead of being taken back and started again by
// every retry: the request is Aborted, a retry is told at once that it is
// being made, and once ready a retry returns that same snapshot, made
// once. A snapshot the driver's stop cuts leaves nothing.
func TestSnapshotOutlivesTheRequest(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	v := mustCreate(t, d, "big", 1<<30)
	// 128 files of 1 MiB, incompressible: gzip takes a while, and an
	// archive stops between files when it is cancelled.
	data := make([]byte, 1<<20)
	for i := range 128 {
		rand.Read(data)
		if err := os.WriteFile(filepath.Join(volumeDir(d, v.GetVolumeId()), fmt.Sprintf("data-%d", i)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	short := func(name string) error {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err := d.CreateSnapshot(rctx, snapReq(name, v.GetVolumeId(), map[string]string{"format": "tar.gz"}))
		return err
	}
	if err := short("s"); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "goes on past this request") {
		t.Fatalf("a snapshot longer than its request: %v, want Aborted saying it goes on", err)
	}
	creating, ok := snapshotNamed(d, "s")
	if !ok {
		t.Fatal("no record of the snapshot being made")
	}
	start := time.Now()
	_, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), map[string]string{"format": "tar.gz"}))
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "is being made") || time.Since(start) > 5*time.Second {
		t.Fatalf("a retry while it is made: %v after %v, want Aborted at once saying it is being made", err, time.Since(start))
	}
	var answers int
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		answers++
		s, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), map[string]string{"format": "tar.gz"}))
		if err == nil {
			if id := s.GetSnapshot().GetSnapshotId(); id != creating.ID || !s.GetSnapshot().GetReadyToUse() {
				t.Fatalf("the snapshot returned once ready: %s (ready %v), want %s, the one being made", id, s.GetSnapshot().GetReadyToUse(), creating.ID)
			}
			break
		}
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			t.Fatalf("a retry: %v", err)
		}
	}
	t.Logf("made past its request in %v, %d retries answered", time.Since(start).Round(time.Millisecond), answers)

	// The driver's stop cuts one being made: nothing is left.
	if err := short("cut"); status.Code(err) != codes.Aborted {
		t.Fatalf("a snapshot longer than its request: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if s, ok := snapshotNamed(d, "cut"); ok {
		t.Fatalf("the cut snapshot left its record: %+v", s)
	}
	if n := len(allSnapshots(d)); n != 1 {
		t.Fatalf("%d snapshots after the stop, want the one made", n)
	}
}
