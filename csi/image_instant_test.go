package csi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// logRecord is one 4 KiB record of the writer: its sequence number, then
// filler, then the CRC of both; a torn record fails its CRC.
const logRecord = 4096

func record(seq uint64) []byte {
	b := make([]byte, logRecord)
	binary.LittleEndian.PutUint64(b, seq)
	for i := 8; i < logRecord-4; i++ {
		b[i] = byte(seq) ^ byte(i)
	}
	binary.LittleEndian.PutUint32(b[logRecord-4:], crc32.ChecksumIEEE(b[:logRecord-4]))
	return b
}

// checkLog reads a writer's log back: every whole record intact and in
// sequence from 0, and returns how many there are.
func checkLog(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n := len(b) / logRecord
	for i := 0; i < n; i++ {
		r := b[i*logRecord : (i+1)*logRecord]
		if crc32.ChecksumIEEE(r[:logRecord-4]) != binary.LittleEndian.Uint32(r[logRecord-4:]) || binary.LittleEndian.Uint64(r) != uint64(i) {
			return i, fmt.Errorf("record %d of %d is torn or out of sequence", i, n)
		}
	}
	return n, nil
}

// TestImageSnapshotIsOneInstant: snapshots and group snapshots of image
// volumes taken while a writer appends to a log and makes, renames and
// removes files on them are each one instant: e2fsck -fn finds every
// snapshot's file system clean as it is (no journal to replay: the freeze
// committed it), and a volume restored from one holds a log whose records
// are all whole and in sequence. On an XFS pool the copy is a reflink, on
// an ext4 pool a copy of the allocated extents, both while frozen.
func TestImageSnapshotIsOneInstant(t *testing.T) {
	for _, fstype := range []string{"xfs", "ext4"} {
		t.Run(fstype, func(t *testing.T) {
			mnt := testfs.FileSystem(t, run, fstype, 1<<30, nil, "")
			cfg := testConfig(t)
			cfg.StateDir = filepath.Join(mnt, "state")
			d := newDriver(t, cfg)
			const size = 128 << 20
			a := createImage(t, d, "a", size, nil)
			b := createImage(t, d, "b", size, nil)
			_, ta := stageAndPublish(t, d, a.GetVolumeId())
			_, tb := stageAndPublish(t, d, b.GetVolumeId())

			wctx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for _, target := range []string{ta, tb} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- churn(wctx, target)
				}()
			}
			// Snapshots once the writers are well under way.
			for _, target := range []string{ta, tb} {
				for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
					if st, err := os.Stat(filepath.Join(target, "log")); err == nil && st.Size() >= 1<<20 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("the writer on %s wrote less than 1 MiB in 60 s", target)
					}
				}
			}
			var snaps []string
			for i := 0; i < 4; i++ {
				s, err := d.CreateSnapshot(ctx, snapReq(fmt.Sprintf("s%d", i), a.GetVolumeId(), nil))
				if err != nil {
					t.Fatal(err)
				}
				snaps = append(snaps, s.GetSnapshot().GetSnapshotId())
			}
			for i := 0; i < 2; i++ {
				g, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: fmt.Sprintf("g%d", i), SourceVolumeIds: []string{a.GetVolumeId(), b.GetVolumeId()}})
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range g.GetGroupSnapshot().GetSnapshots() {
					snaps = append(snaps, s.GetSnapshotId())
				}
			}
			stop()
			wg.Wait()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range snaps {
				if !testutil.HaveTools(t, "e2fsck") {
					break
				}
				rec, _ := snapshotRec(d, id)
				if err := run("e2fsck", "-fn", d.eng.SnapshotDataPath(rec)); err != nil {
					t.Fatalf("snapshot %s (of %s) is not a clean file system: %v", id, rec.SourceVolume, err)
				}
			}
			// The last group's members, restored: each log whole.
			for i, id := range snaps[len(snaps)-2:] {
				r := createImage(t, d, fmt.Sprintf("r%d", i), size, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}})
				_, tr := stageAndPublish(t, d, r.GetVolumeId())
				n, err := checkLog(filepath.Join(tr, "log"))
				if err != nil {
					t.Fatalf("restored snapshot %s: %v", id, err)
				}
				t.Logf("snapshot %s holds %d whole log records", id, n)
			}
		})
	}
}

// churn appends records to target/log, fsyncing every 16, and makes,
// renames and removes small files beside it, until ctx is done.
func churn(ctx context.Context, target string) error {
	f, err := os.OpenFile(filepath.Join(target, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	for seq := uint64(0); ctx.Err() == nil; seq++ {
		if _, err := f.Write(record(seq)); err != nil {
			return err
		}
		if seq%16 == 15 {
			if err := f.Sync(); err != nil {
				return err
			}
			tmp := filepath.Join(target, fmt.Sprintf("t%d", seq%64))
			if err := os.WriteFile(tmp, record(seq), 0o644); err != nil {
				return err
			}
			if err := os.Rename(tmp, filepath.Join(target, fmt.Sprintf("f%d", seq%8))); err != nil {
				return err
			}
			if err := os.Remove(filepath.Join(target, fmt.Sprintf("f%d", (seq+4)%8))); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		if seq > (96<<20)/logRecord {
			break // stay inside the volume
		}
	}
	return nil
}

// TestImageFreezeBound: on an ext4 pool, where a snapshot copies the
// image's extents while frozen, a copy longer than MaxFreeze is thawed at
// the bound and refused (PermissionDenied, saying why), leaving no
// snapshot and the volume writable; with room, the same snapshot is made.
func TestImageFreezeBound(t *testing.T) {
	mnt := testfs.FileSystem(t, run, "ext4", 1<<30, nil, "")
	cfg := testConfig(t)
	cfg.StateDir = filepath.Join(mnt, "state")
	cfg.MaxFreeze = time.Millisecond
	d := newDriver(t, cfg)
	v := createImage(t, d, "img", 128<<20, nil)
	_, target := stageAndPublish(t, d, v.GetVolumeId())
	if err := writeMiB(filepath.Join(target, "data"), 48); err != nil {
		t.Fatal(err)
	}
	_, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), nil))
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "--max-freeze") {
		t.Fatalf("a copy longer than the bound: %v, want Aborted naming --max-freeze", err)
	}
	if n := len(allSnapshots(d)); n != 0 {
		t.Fatalf("%d snapshots left after a refused cut", n)
	}
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(target, "after"), []byte("x"), 0o644) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the volume is still frozen after a refused cut")
	}
	d.eng.Config.MaxFreeze = time.Minute
	// On ext4 the extents are copied after the cut and answered not
	// ready; wait for ready, as the snapshotter does, so the snapshot is
	// made (and the volume free to delete) before the test ends.
	s, err := testutil.SnapshotReady(ctx, d.CreateSnapshot, snapReq("s", v.GetVolumeId(), nil))
	if err != nil {
		t.Fatal(err)
	}
	if !s.GetSnapshot().GetReadyToUse() {
		t.Fatalf("snapshot with room under the bound: %v, want ready", s.GetSnapshot())
	}
}
