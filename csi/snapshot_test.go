package csi

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testfs"
)

func fillVolume(t *testing.T, dir string) {
	t.Helper()
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "a.txt"), bytes.Repeat([]byte("snapshot me "), 10000), 0o640)
	os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
	f, _ := os.Create(filepath.Join(dir, "sparse"))
	f.WriteAt([]byte("end"), 50<<20)
	f.Close()
}

func sameTree(t *testing.T, a, b string) {
	t.Helper()
	for _, p := range []string{"sub/a.txt", "sparse"} {
		x, _ := os.ReadFile(filepath.Join(a, p))
		y, err := os.ReadFile(filepath.Join(b, p))
		if err != nil || !bytes.Equal(x, y) {
			t.Fatalf("%s differs: %v", p, err)
		}
	}
	if l, _ := os.Readlink(filepath.Join(b, "link")); l != "/etc/passwd" {
		t.Fatalf("symlink %q", l)
	}
}

func snapReq(name, vol string, params map[string]string) *csi.CreateSnapshotRequest {
	return &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol, Parameters: params}
}

func fromSnapshot(name, snap string, size int64) *csi.CreateVolumeRequest {
	r := createReq(name, size)
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}
	return r
}

func TestSnapshotRestoreClone(t *testing.T) {
	for _, fstype := range []string{"ext4", "btrfs"} {
		t.Run(fstype, func(t *testing.T) {
			cfg := testConfig(t)
			if fstype == "btrfs" {
				cfg.StateDir = filepath.Join(testfs.FileSystem(t, run, "btrfs", 2<<30, nil, ""), "state")
			}
			d := newDriver(t, cfg)
			src := mustCreate(t, d, "src", 100<<20)
			srcDir := volumeDir(d, src.GetVolumeId())
			fillVolume(t, srcDir)
			formats := map[string]map[string]string{
				engine.FormatTarGz:  {engine.ParamFormat: engine.FormatTarGz},
				engine.FormatTarZst: {engine.ParamCompression: "zstd"},
			}
			if d.defaultPool().Reflink {
				formats[engine.FormatReflink] = map[string]string{engine.ParamFormat: engine.FormatReflink}
			}
			for format, params := range formats {
				s1, err := d.CreateSnapshot(ctx, snapReq("snap-"+format, src.GetVolumeId(), params))
				if err != nil {
					t.Fatal(err)
				}
				snap := s1.GetSnapshot()
				if rec, _ := snapshotRec(d, snap.GetSnapshotId()); rec.Format != format {
					t.Fatalf("parameters %v made a %s snapshot, want %s", params, rec.Format, format)
				} else if format == engine.FormatTarZst {
					b, _ := os.ReadFile(d.eng.SnapshotDataPath(rec))
					if !strings.HasSuffix(d.eng.SnapshotDataPath(rec), ".tar.zst") || !isPzstd(b) {
						t.Fatalf("tar.zst snapshot %s does not hold zstd frames with their lengths", d.eng.SnapshotDataPath(rec))
					}
				}
				s2, err := d.CreateSnapshot(ctx, snapReq("snap-"+format, src.GetVolumeId(), params))
				if err != nil || s2.GetSnapshot().GetSnapshotId() != snap.GetSnapshotId() {
					t.Fatalf("retried CreateSnapshot: %v %v", s2, err)
				}
				if !snap.GetReadyToUse() || snap.GetSizeBytes() < 120000 || snap.GetSizeBytes() > 1<<20 {
					t.Fatalf("%s snapshot %+v: size should be the data it holds", format, snap)
				}
				r, err := d.CreateVolume(ctx, fromSnapshot("restore-"+format, snap.GetSnapshotId(), 200<<20))
				if err != nil {
					t.Fatal(err)
				}
				if r.GetVolume().GetCapacityBytes() != 200<<20 {
					t.Fatalf("restore into a larger volume got %d bytes", r.GetVolume().GetCapacityBytes())
				}
				sameTree(t, srcDir, volumeDir(d, r.GetVolume().GetVolumeId()))
				var st fsops.Usage
				if st, err = fsops.TreeUsage(volumeDir(d, r.GetVolume().GetVolumeId())); err != nil || st.Bytes > 2<<20 {
					t.Fatalf("restored tree allocates %d bytes: holes lost (%v)", st.Bytes, err)
				}
			}
			c, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: []*csi.VolumeCapability{rwo},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}}})
			if err != nil {
				t.Fatal(err)
			}
			if c.GetVolume().GetCapacityBytes() != 100<<20 {
				t.Fatalf("clone without a size should take its source's, got %d", c.GetVolume().GetCapacityBytes())
			}
			sameTree(t, srcDir, volumeDir(d, c.GetVolume().GetVolumeId()))
			// A clone retried after it succeeded returns the same volume.
			again, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "clone", VolumeCapabilities: []*csi.VolumeCapability{rwo},
				VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}}})
			if err != nil || again.GetVolume().GetVolumeId() != c.GetVolume().GetVolumeId() {
				t.Fatalf("retried clone: %v %v", again, err)
			}
		})
	}
}

func TestSnapshotParameters(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "v", 1<<20)
	for _, p := range []map[string]string{
		{"format": "zip"}, {"compression": "max"}, {"unknown": "x"}, {"format": "reflink", "compression": "zstd"},
	} {
		_, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), p))
		wantCode(t, err, codes.InvalidArgument)
	}
	if !d.defaultPool().Reflink {
		_, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), map[string]string{"format": "reflink"}))
		wantCode(t, err, codes.InvalidArgument)
	}
	if _, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), map[string]string{"format": "tar.gz", "compression": "compact", "csi.storage.k8s.io/volumesnapshot/name": "x"})); err != nil {
		t.Fatal(err)
	}
	_, err := d.CreateSnapshot(ctx, snapReq("s", mustCreate(t, d, "other", 1<<20).GetVolumeId(), nil))
	wantCode(t, err, codes.AlreadyExists)
	_, err = d.CreateSnapshot(ctx, snapReq("s2", engine.NewID(engine.VolumeIDPrefix, d.eng.Tag), nil))
	wantCode(t, err, codes.NotFound)
}

// TestCorruptSnapshot: a damaged archive restores to nothing: DataLoss,
// and no half-made volume is left.
func TestCorruptSnapshot(t *testing.T) {
	d := newDriver(t, testConfig(t))
	v := mustCreate(t, d, "v", 10<<20)
	fillVolume(t, volumeDir(d, v.GetVolumeId()))
	s, err := d.CreateSnapshot(ctx, snapReq("s", v.GetVolumeId(), map[string]string{"format": "tar.gz"}))
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := snapshotRec(d, s.GetSnapshot().GetSnapshotId())
	path := d.eng.SnapshotDataPath(rec)
	data, _ := os.ReadFile(path)
	for name, bad := range map[string][]byte{"truncated": data[:len(data)/2], "flipped": flip(data)} {
		os.WriteFile(path, bad, 0o600)
		_, err := d.CreateVolume(ctx, fromSnapshot("r-"+name, rec.ID, 10<<20))
		wantCode(t, err, codes.DataLoss)
		if _, ok := volumeNamed(d, "r-"+name); ok {
			t.Fatal("failed restore left a record")
		}
		entries, _ := volumeData(d)
		if len(entries) != 1 {
			t.Fatalf("failed restore left data: %v", entries)
		}
	}
}

func flip(b []byte) []byte {
	c := append([]byte(nil), b...)
	c[len(c)-12] ^= 0x55 // inside the data or trailer: the checksum must catch it
	return c
}

func TestListSnapshots(t *testing.T) {
	d := newDriver(t, testConfig(t))
	a := mustCreate(t, d, "a", 1<<20)
	b := mustCreate(t, d, "b", 1<<20)
	for i := 0; i < 3; i++ {
		if _, err := d.CreateSnapshot(ctx, snapReq(fmt.Sprint("a", i), a.GetVolumeId(), nil)); err != nil {
			t.Fatal(err)
		}
	}
	one, _ := d.CreateSnapshot(ctx, snapReq("b0", b.GetVolumeId(), nil))
	r, _ := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: a.GetVolumeId()})
	if len(r.GetEntries()) != 3 {
		t.Fatalf("filter by source volume returned %d of 3", len(r.GetEntries()))
	}
	r, _ = d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: one.GetSnapshot().GetSnapshotId()})
	if len(r.GetEntries()) != 1 || r.GetEntries()[0].GetSnapshot().GetSourceVolumeId() != b.GetVolumeId() {
		t.Fatalf("filter by id: %v", r)
	}
	var all []string
	token := ""
	for {
		r, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 1, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range r.GetEntries() {
			all = append(all, e.GetSnapshot().GetSnapshotId())
		}
		if token = r.GetNextToken(); token == "" {
			break
		}
	}
	if len(all) != 4 {
		t.Fatalf("paged through %d of 4 snapshots", len(all))
	}
	_, err := d.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "0"})
	wantCode(t, err, codes.Aborted)
	_, err = d.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: engine.NewID(engine.SnapshotIDPrefix, d.eng.Tag)})
	wantCode(t, err, codes.NotFound)
}

// isPzstd tells whether b starts as pzstd's format does: a skippable frame
// of four bytes (the next frame's length), then a zstd frame.
// isPzstd: the archive opens with the start unit (a skippable frame of
// magic 0x184D2A5E), then pzstd's skippable frame with a length and a zstd
// frame, and ends with the end unit.
func isPzstd(b []byte) bool {
	start, end := append([]byte{0x5e, 0x2a, 0x4d, 0x18, 8, 0, 0, 0}, "HPCSI-S1"...), append([]byte{0x5e, 0x2a, 0x4d, 0x18, 8, 0, 0, 0}, "HPCSI-E1"...)
	if !bytes.HasPrefix(b, start) || !bytes.HasSuffix(b, end) {
		return false
	}
	b = b[len(start):]
	return len(b) > 16 && bytes.HasPrefix(b, []byte{0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0}) &&
		bytes.HasPrefix(b[12:], []byte{0x28, 0xb5, 0x2f, 0xfd})
}
