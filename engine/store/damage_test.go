package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/faultfs"
)

// damageHeader overwrites the journal's header as a disk that mangled
// its first sector would.
func damageHeader(t *testing.T, dir string, with []byte) {
	t.Helper()
	jf, err := os.OpenFile(filepath.Join(dir, "journal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer jf.Close()
	if _, err := jf.WriteAt(with, 0); err != nil {
		t.Fatal(err)
	}
}

// TestJournalDamagedHeaderKeepsLiveEntries: a journal whose header does
// not check still holds the live epoch's entries, each carrying its
// epoch. Open reads them by it and applies them again, so a ready record
// whose only durable copy was its entry comes back ready (in the first
// version a bad header zeroed the file, and the record came back
// creating: reconcile would have removed the volume's data). The next
// epoch is past every epoch in the file, so nothing written before counts
// again once a later start finds the header damaged once more.
func TestJournalDamagedHeaderKeepsLiveEntries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage []byte
	}{
		{"garbage", []byte("garbage!garbage!")},
		{"zeroed", make([]byte, minUnit)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			vols := filepath.Join(dir, "volumes")
			creating := Volume{ID: "id-1", Name: "a", Phase: Creating}
			if err := s.Volumes.Put(creating); err != nil {
				t.Fatal(err)
			}
			old, _ := os.ReadFile(filepath.Join(vols, "id-1.json"))
			// Each Put syncs: the entries are on units of their own.
			for _, v := range []Volume{{ID: "id-1", Name: "a", Phase: Ready, CapacityBytes: 7}, {ID: "id-2", Name: "b", Phase: Ready}} {
				if err := s.Volumes.Put(v); err != nil {
					t.Fatal(err)
				}
			}
			// A power loss: id-1's last rename and id-2's file lost, and
			// the header mangled. s is never closed, as in a crash.
			os.WriteFile(filepath.Join(vols, "id-1.json"), old, 0o600)
			os.Remove(filepath.Join(vols, "id-2.json"))
			damageHeader(t, dir, tc.damage)

			s2 := open(t, dir)
			if v, ok := s2.Volumes.Get("id-1"); !ok || v.Phase != Ready || v.CapacityBytes != 7 {
				t.Fatalf("id-1, ready in the live epoch's entries: %+v %v", v, ok)
			}
			if v, ok := s2.Volumes.Get("id-2"); !ok || v.Phase != Ready {
				t.Fatalf("id-2, made in the live epoch: %+v %v", v, ok)
			}
			if n := s2.Notes(); len(n) != 1 || !strings.Contains(n[0], "header is damaged") || !strings.Contains(n[0], "3 in sequence") {
				t.Fatalf("notes %q, want one saying the header is damaged and 3 entries were applied", n)
			}
			if err := s2.Volumes.Put(Volume{ID: "id-3", Name: "c", Phase: Ready}); err != nil {
				t.Fatal(err)
			}
			// By hand after that start's checkpoint: entries of the
			// epochs before must not undo it.
			os.WriteFile(filepath.Join(vols, "id-1.json"), []byte(`{"id":"id-1","name":"a","phase":"deleting"}`), 0o600)
			os.Remove(filepath.Join(vols, "id-3.json"))
			damageHeader(t, dir, tc.damage)
			s3 := open(t, dir)
			if v, _ := s3.Volumes.Get("id-1"); v.Phase != Deleting {
				t.Fatalf("an entry of an epoch already checkpointed was applied again: %+v", v)
			}
			if v, ok := s3.Volumes.Get("id-3"); !ok || v.Phase != Ready {
				t.Fatalf("id-3, of the live epoch: %+v %v", v, ok)
			}
			if err := s3.Close(); err != nil {
				t.Fatal(err)
			}
			if n := open(t, dir).Notes(); len(n) != 0 {
				t.Fatalf("a clean journal has notes: %q", n)
			}
		})
	}
}

// TestJournalNeverHeadered: a journal that never got its header (a crash
// while it was first filled with zeros) is one with nothing to apply: it
// is filled up and used, with no note.
func TestJournalNeverHeadered(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"volumes", "snapshots", "groups"} {
		os.MkdirAll(filepath.Join(dir, d), 0o700)
	}
	os.WriteFile(filepath.Join(dir, "journal"), make([]byte, 100<<10), 0o600)
	s := open(t, dir)
	if n := s.Notes(); len(n) != 0 {
		t.Fatalf("notes %q", n)
	}
	if err := s.Volumes.Put(Volume{ID: "id-1", Name: "a", Phase: Ready}); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "journal")); fi.Size() != DefaultJournalSize {
		t.Fatalf("journal of %d bytes", fi.Size())
	}
}

// TestUnreadableRecordsDamaged: a record file that cannot be read, or is
// no regular file, is damage like an empty one: Open succeeds, reports
// it, keeps it and refuses its id, and serves the other records (in the
// first version Open failed, and with it every volume of the node).
func TestUnreadableRecordsDamaged(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for _, id := range []string{"id-1", "id-ok"} {
		if err := s.Volumes.Put(Volume{ID: id, Name: "n" + id, Phase: Ready}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	vols := filepath.Join(dir, "volumes")
	os.Mkdir(filepath.Join(vols, "id-2.json"), 0o700)
	os.Symlink(filepath.Join(dir, "nowhere"), filepath.Join(vols, "id-3.json"))
	os.Symlink(filepath.Join(vols, "id-1.json"), filepath.Join(vols, "id-4.json"))
	s2 := open(t, dir)
	want := map[string]string{"id-2": "directory", "id-3": "symbolic link", "id-4": "symbolic link"}
	got := s2.Damaged()
	if len(got) != len(want) {
		t.Fatalf("damaged %+v, want %v", got, want)
	}
	for _, d := range got {
		if !strings.Contains(d.Problem, want[d.ID]) || !s2.Volumes.IsDamaged(d.ID) {
			t.Errorf("%s: %q, want it to say %q", d.ID, d.Problem, want[d.ID])
		}
		if _, err := os.Lstat(d.Path); err != nil {
			t.Errorf("damaged record %s removed: %v", d.Path, err)
		}
	}
	for _, id := range []string{"id-1", "id-ok"} {
		if v, ok := s2.Volumes.Get(id); !ok || v.Phase != Ready {
			t.Fatalf("sound record %s: %+v %v", id, v, ok)
		}
	}
}

// TestRecordReadEIO: a record file whose read fails with EIO (a real one,
// through faultfs) is reported damaged; Open serves the rest.
func TestRecordReadEIO(t *testing.T) {
	backing := t.TempDir()
	ffs := faultfs.Mount(t, backing, filepath.Join(t.TempDir(), "mnt"))
	s := open(t, ffs.Dir)
	for _, id := range []string{"id-1", "id-2"} {
		if err := s.Volumes.Put(Volume{ID: id, Name: "n" + id, Phase: Ready}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ffs.Inject(faultfs.Fault{Op: faultfs.Read, Match: func(p string) bool { return p == "/volumes/id-1.json" }})
	s2, err := Open(ffs.Dir, IDRules{Volume: anyID, Snapshot: anyID, Group: anyID})
	if err != nil {
		t.Fatalf("one unreadable record stops Open: %v", err)
	}
	defer s2.Close()
	if d := s2.Damaged(); len(d) != 1 || d[0].ID != "id-1" || !strings.Contains(d[0].Problem, "input/output error") {
		t.Fatalf("damaged %+v, want id-1 with its EIO", d)
	}
	if _, ok := s2.Volumes.Get("id-2"); !ok {
		t.Fatal("the readable record is not served")
	}
}

// TestJournalRejectedEntryKept: an entry for an id that today's rules do
// not take is not applied, and not lost: it is kept, reported as damage
// at this start and the next, and Open succeeds (it failed before).
func TestJournalRejectedEntryKept(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for _, id := range []string{"id-old", "id-1"} {
		if err := s.Volumes.Put(Volume{ID: id, Name: "n" + id, Phase: Ready}); err != nil {
			t.Fatal(err)
		}
	}
	// A crash, then a driver whose rules reject id-old.
	rules := IDRules{Volume: func(id string) bool { return anyID(id) && id != "id-old" }, Snapshot: anyID, Group: anyID}
	os.Remove(filepath.Join(dir, "volumes", "id-1.json"))
	for range 2 {
		s2, err := Open(dir, rules)
		if err != nil {
			t.Fatalf("an entry the rules reject stops Open: %v", err)
		}
		d := s2.Damaged()
		if len(d) != 1 || d[0].ID != "id-old" || !strings.Contains(d[0].Problem, "id rules do not take") {
			t.Fatalf("damaged %+v", d)
		}
		if b, err := os.ReadFile(d[0].Path); err != nil || !bytes.Contains(b, []byte(`"id-old"`)) {
			t.Fatalf("the kept entry %s: %s %v", d[0].Path, b, err)
		}
		if _, ok := s2.Volumes.Get("id-1"); !ok {
			t.Fatal("the entry beside it was not applied")
		}
		if err := s2.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestUncertainCommit: a commit whose entry is written but whose
// fdatasync fails (a real EIO, through faultfs) says that its outcome is
// decided at the next start (ErrUncertain), refuses the changes after it,
// and the next start does redo it when the entry is there, as the error
// said it might (the first version said "nothing changed").
func TestUncertainCommit(t *testing.T) {
	backing := t.TempDir()
	ffs := faultfs.Mount(t, backing, filepath.Join(t.TempDir(), "mnt"))
	s := open(t, ffs.Dir)
	if err := s.Volumes.Put(Volume{ID: "id-1", Name: "a", Phase: Creating}); err != nil {
		t.Fatal(err)
	}
	ffs.Inject(faultfs.Fault{Op: faultfs.Sync, Match: func(p string) bool { return p == "/journal" }})
	err := s.Volumes.Put(Volume{ID: "id-1", Name: "a", Phase: Ready})
	if !errors.Is(err, ErrUncertain) || !errors.Is(err, unix.EIO) {
		t.Fatalf("Put whose sync failed: %v, want ErrUncertain and EIO", err)
	}
	if v, _ := s.Volumes.Get("id-1"); v.Phase != Creating {
		t.Fatalf("the index shows an uncertain change: %+v", v)
	}
	if err := s.Volumes.Put(Volume{ID: "id-2", Name: "b", Phase: Ready}); err == nil || errors.Is(err, ErrUncertain) {
		t.Fatalf("Put after the failed sync: %v, want a refusal that is not uncertain", err)
	}
	s.Close()
	ffs.Clear()
	// The entry reached the backing file: the next start redoes it.
	s2 := open(t, backing)
	defer s2.Close()
	if v, _ := s2.Volumes.Get("id-1"); v.Phase != Ready {
		t.Fatalf("after the restart: %+v, want the uncertain change redone", v)
	}
	if _, ok := s2.Volumes.Get("id-2"); ok {
		t.Fatal("the refused change stands")
	}
}

// TestJournalAppendUnit: the append unit is the largest of 4 KiB, the
// page size and the file system's block size; entries start on the unit
// after the header's, and an append after a sync on a unit of its own, so
// with a 64 KiB unit a torn write of the unit after an acknowledged entry
// takes nothing acknowledged. A journal written with any unit reads.
func TestJournalAppendUnit(t *testing.T) {
	dir := t.TempDir()
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	u, err := appendUnit(f)
	f.Close()
	if want := alignUp(max(minUnit, int64(os.Getpagesize()), sfs.Bsize), minUnit); err != nil || u != min(want, maxUnit) {
		t.Fatalf("unit %d %v, want %d", u, err, want)
	}

	testUnit = maxUnit
	defer func() { testUnit = 0 }()
	s := open(t, dir)
	for i, id := range []string{"id-1", "id-2", "id-3"} {
		if err := s.Volumes.Put(Volume{ID: id, Name: id, Phase: Ready, CapacityBytes: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	buf, _ := os.ReadFile(filepath.Join(dir, "journal"))
	var offs []int
	entriesIn(buf, func(epoch uint64, off int) {
		if epoch == binary.LittleEndian.Uint64(buf[4:12]) {
			offs = append(offs, off)
		}
	})
	if len(offs) != 3 || offs[0] != maxUnit || offs[1] != 2*maxUnit || offs[2] != 3*maxUnit {
		t.Fatalf("entries at %v, want each on a %d-byte unit of its own from the second", offs, maxUnit)
	}
	// A torn write of the unit after id-1's entry: garbage from its end
	// to the next unit, and every record file lost.
	jf, _ := os.OpenFile(filepath.Join(dir, "journal"), os.O_RDWR, 0)
	jf.WriteAt(bytes.Repeat([]byte{0xa5}, 4096), int64(alignUp(offs[0]+entryHeadSize+10, minUnit)))
	jf.Close()
	for _, id := range []string{"id-1", "id-2", "id-3"} {
		os.Remove(filepath.Join(dir, "volumes", id+".json"))
	}
	testUnit = 0
	s2 := open(t, dir)
	for _, id := range []string{"id-1", "id-2", "id-3"} {
		if _, ok := s2.Volumes.Get(id); !ok {
			t.Errorf("%s, acknowledged, is lost", id)
		}
	}
}

// TestSmallJournal: a journal made small checkpoints every few commits,
// its changes all survive a loss of every record file since the last
// checkpoint, and a start with the default size reads and keeps it.
func TestSmallJournal(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, IDRules{Volume: anyID, Snapshot: anyID, Group: anyID}, Options{JournalSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := s.Volumes.Put(Volume{ID: "id-1", Name: "a", Phase: Ready, CapacityBytes: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	s.journal.mu.Lock()
	epoch := s.journal.epoch
	s.journal.mu.Unlock()
	if epoch < 5 {
		t.Fatalf("epoch %d after 100 commits in a 64 KiB journal", epoch)
	}
	os.Remove(filepath.Join(dir, "volumes", "id-1.json"))
	s2 := open(t, dir)
	if v, ok := s2.Volumes.Get("id-1"); !ok || v.CapacityBytes != 99 {
		t.Fatalf("after the loss: %+v %v", v, ok)
	}
}
