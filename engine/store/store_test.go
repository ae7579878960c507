package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

func anyID(id string) bool { return strings.HasPrefix(id, "id-") }

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, IDRules{Volume: anyID, Snapshot: anyID, Group: anyID})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTableLifecycle(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	v := Volume{ID: "id-1", Name: "pvc-1", Phase: Creating, Parameters: map[string]string{"k": "v"}}
	if err := s.Volumes.Reserve(&v, nil); err != nil {
		t.Fatal(err)
	}
	dup := Volume{ID: "id-2", Name: "pvc-1"}
	err := s.Volumes.Reserve(&dup, nil)
	if !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), `volume name "pvc-1"`) {
		t.Fatalf("second reservation of a name: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes", "id-1.json")); !os.IsNotExist(err) {
		t.Fatal("a reservation wrote a file")
	}
	s.Volumes.Unreserve("id-1")
	if _, ok := s.Volumes.ByName("pvc-1"); ok {
		t.Fatal("unreserved name still taken")
	}
	// A creating record is on disk and in the index.
	if err := s.Volumes.Reserve(&v, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Volumes.Put(v); err != nil {
		t.Fatal(err)
	}
	if got, ok := open(t, dir).Volumes.Get("id-1"); !ok || got.Phase != Creating {
		t.Fatalf("pending record read back: %+v %v", got, ok)
	}
	v.Phase = Ready
	if err := s.Volumes.Put(v); err != nil {
		t.Fatal(err)
	}
	got, ok := s.Volumes.Get("id-1")
	if !ok || got.Phase != Ready {
		t.Fatalf("get %+v %v", got, ok)
	}
	got.Parameters["k"] = "changed" // a copy: the index keeps its own
	if again, _ := s.Volumes.Get("id-1"); again.Parameters["k"] != "v" {
		t.Fatal("Get shares its map with the index")
	}
	// A capacity check sees every record and can refuse.
	refuse := errors.New("full")
	err = s.Volumes.Reserve(&Volume{ID: "id-3", Name: "pvc-3"}, func(_ *Volume, all map[string]Volume) error {
		if len(all) != 1 {
			t.Errorf("check saw %d records", len(all))
		}
		return refuse
	})
	if !errors.Is(err, refuse) {
		t.Fatalf("refused reservation: %v", err)
	}
	if err := s.Snapshots.Put(Snapshot{ID: "id-s", Name: "snap", Phase: Ready}); err != nil {
		t.Fatal(err)
	}
	if err := s.Groups.Put(Group{ID: "id-g", Name: "g", Snapshots: []string{"id-s"}}); err != nil {
		t.Fatal(err)
	}

	// A restart sees the same records and clears interrupted writes.
	tmp := filepath.Join(dir, "volumes", ".id-9.json.tmp-1")
	os.WriteFile(tmp, []byte("{"), 0o600)
	os.WriteFile(filepath.Join(dir, "volumes", "README"), []byte("not ours"), 0o600)
	s2 := open(t, dir)
	if all := s2.Volumes.All(); len(all) != 1 || all[0].Name != "pvc-1" {
		t.Fatalf("after reload: %+v", all)
	}
	if g, ok := s2.Groups.ByName("g"); !ok || g.Snapshots[0] != "id-s" {
		t.Fatalf("group after reload: %+v", g)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatal("temporary file of an interrupted write survived")
	}
	if _, err := os.Stat(filepath.Join(dir, "volumes", "README")); err != nil {
		t.Fatal("a file that is not a record was removed")
	}
	if err := s2.Volumes.Drop("id-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s2.Volumes.ByName("pvc-1"); ok {
		t.Fatal("dropped record still found by name")
	}
	if err := s2.Volumes.Drop("id-1"); err != nil {
		t.Fatalf("dropping twice: %v", err)
	}
}

// TestDamagedRecordsKept: a record file that is empty, not JSON, or
// holds another id is listed as damaged and left as it is, never removed
// or taken for an unfinished create.
func TestDamagedRecordsKept(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for _, id := range []string{"id-1", "id-2", "id-3", "id-4"} {
		if err := s.Volumes.Put(Volume{ID: id, Name: "n" + id, Phase: Ready}); err != nil {
			t.Fatal(err)
		}
	}
	// After Close the journal no longer holds the changes, so nothing
	// can repair the files.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	vols := filepath.Join(dir, "volumes")
	os.WriteFile(filepath.Join(vols, "id-1.json"), nil, 0o600)
	os.WriteFile(filepath.Join(vols, "id-2.json"), []byte("{garbage"), 0o600)
	os.WriteFile(filepath.Join(vols, "id-3.json"), []byte(`{"id":"id-9","name":"x"}`), 0o600)
	s2 := open(t, dir)
	want := map[string]string{"id-1": "empty", "id-2": "not a record", "id-3": `"id-9"`}
	got := s2.Damaged()
	if len(got) != len(want) {
		t.Fatalf("damaged %+v", got)
	}
	for _, d := range got {
		if !strings.Contains(d.Problem, want[d.ID]) || !s2.Volumes.IsDamaged(d.ID) {
			t.Errorf("%s: %q, want it to say %q", d.ID, d.Problem, want[d.ID])
		}
		if _, err := os.Stat(d.Path); err != nil {
			t.Errorf("damaged record %s removed: %v", d.Path, err)
		}
		if _, ok := s2.Volumes.Get(d.ID); ok {
			t.Errorf("damaged record %s in the index", d.ID)
		}
	}
	if v, ok := s2.Volumes.Get("id-4"); !ok || v.Phase != Ready {
		t.Fatalf("the sound record beside them: %+v %v", v, ok)
	}
}

// freeze copies the state dir as a power loss at this instant could leave
// it on XFS, or ext4 mounted noauto_da_alloc: every file as written (the
// journal is synced where it matters), except that the record just
// renamed into place has its name on disk but not its content.
func freeze(t *testing.T, dir, emptied string) string {
	t.Helper()
	out := t.TempDir()
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if e.IsDir() {
			return os.MkdirAll(filepath.Join(out, rel), 0o700)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if p == emptied {
			data = nil
		}
		return os.WriteFile(filepath.Join(out, rel), data, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPowerLossDuringPut is the data-loss defect of the journal's first
// version: Put renamed the record file before its journal entry was
// durable, so a power loss right after the rename could leave the record
// empty with nothing to redo it, and start took it for an unfinished
// create (and the volume's data for unowned). Now the entry is durable
// before the rename, and Open redoes it: the record is there, with the old
// content or the new, for every kind of change to a ready record.
func TestPowerLossDuringPut(t *testing.T) {
	for _, change := range []string{"publish", "expand", "delete"} {
		t.Run(change, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			v := Volume{ID: "id-1", Name: "pvc", Phase: Ready, CapacityBytes: 1}
			if err := s.Volumes.Put(v); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil { // the record is durable
				t.Fatal(err)
			}
			s = open(t, dir)
			switch change {
			case "publish":
				v.Published = []Publication{{Target: "/t"}}
			case "expand":
				v.CapacityBytes = 2
			case "delete":
				v.Phase = Deleting
			}
			var frozen string
			testHookPlaced = func(p string) { frozen = freeze(t, dir, p) }
			defer func() { testHookPlaced = nil }()
			if err := s.Volumes.Put(v); err != nil {
				t.Fatal(err)
			}
			testHookPlaced = nil
			if frozen == "" {
				t.Fatal("the hook never ran")
			}
			after := open(t, frozen)
			if d := after.Damaged(); len(d) > 0 {
				t.Fatalf("after the power loss the record is damaged: %+v", d)
			}
			got, ok := after.Volumes.Get("id-1")
			if !ok {
				t.Fatal("after the power loss the record is gone")
			}
			if !reflect.DeepEqual(got, v) {
				t.Fatalf("after the power loss: %+v, want %+v (the entry was durable before the rename)", got, v)
			}
		})
	}
}

// TestFailedCommitChangesNothing: when the journal refuses a change
// (poisoned by a failed sync, or closed), Put and Drop fail and leave the
// record files and the index as they were, and Err says why.
func TestFailedCommitChangesNothing(t *testing.T) {
	for _, how := range []string{"poisoned", "closed"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir)
			v := Volume{ID: "id-1", Name: "pvc", Phase: Ready, CapacityBytes: 1}
			if err := s.Volumes.Put(v); err != nil {
				t.Fatal(err)
			}
			if s.Err() != nil {
				t.Fatalf("a healthy store says %v", s.Err())
			}
			p := filepath.Join(dir, "volumes", "id-1.json")
			before, _ := os.ReadFile(p)
			switch how {
			case "poisoned":
				s.journal.mu.Lock()
				s.journal.failed = errors.New("fdatasync: input/output error")
				s.journal.mu.Unlock()
			case "closed":
				s.Close()
			}
			if s.Err() == nil {
				t.Fatal("Err says nothing of a store that refuses changes")
			}
			changed := v
			changed.CapacityBytes = 2
			if err := s.Volumes.Put(changed); err == nil {
				t.Fatal("Put succeeded")
			}
			if err := s.Volumes.Put(Volume{ID: "id-2", Name: "new"}); err == nil {
				t.Fatal("Put of a new record succeeded")
			}
			if err := s.Volumes.Drop("id-1"); err == nil {
				t.Fatal("Drop succeeded")
			}
			if after, err := os.ReadFile(p); err != nil || string(after) != string(before) {
				t.Fatalf("the record file changed: %s %v", after, err)
			}
			if got, ok := s.Volumes.Get("id-1"); !ok || got.CapacityBytes != 1 {
				t.Fatalf("the index changed: %+v %v", got, ok)
			}
			entries, _ := os.ReadDir(filepath.Join(dir, "volumes"))
			if len(entries) != 1 {
				t.Fatalf("files left behind: %v", entries)
			}
		})
	}
}

// TestTornAppendKeepsAcknowledged: a power loss that tears the sector
// being written by an append (never acknowledged) cannot take entries that
// were: an append after a sync starts on a block of its own. In the
// journal's first version the next entry shared the acknowledged entry's
// last sector, and a torn write of it dropped that entry.
func TestTornAppendKeepsAcknowledged(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for i, id := range []string{"id-1", "id-2"} {
		if err := s.Volumes.Put(Volume{ID: id, Name: id, Phase: Ready, CapacityBytes: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	s.journal.mu.Lock()
	next := s.journal.off
	s.journal.mu.Unlock()
	// The sector the next append writes first comes back as garbage, and
	// the record files' renames are lost.
	jf, err := os.OpenFile(filepath.Join(dir, "journal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	sector := next &^ 511
	if _, err := jf.WriteAt(bytes.Repeat([]byte{0xa5}, 512), sector); err != nil {
		t.Fatal(err)
	}
	jf.Close()
	for _, id := range []string{"id-1", "id-2"} {
		os.Remove(filepath.Join(dir, "volumes", id+".json"))
	}
	s2 := open(t, dir)
	for _, id := range []string{"id-1", "id-2"} {
		if _, ok := s2.Volumes.Get(id); !ok {
			t.Errorf("%s, acknowledged before the torn write, is lost", id)
		}
	}
}

// TestJournalRedoesLostWrites: what a power loss can do to the record
// files written since the last checkpoint (a rename lost, so the old
// content or no file; a new file empty; a removal undone) is repaired at
// Open from the journal, for every change Put and Drop returned for, in
// order; and entries of an earlier epoch, or torn, are not applied.
func TestJournalRedoesLostWrites(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for _, v := range []Volume{{ID: "id-1", Name: "a", Phase: Creating}, {ID: "id-2", Name: "b", Phase: Ready}, {ID: "id-3", Name: "c", Phase: Ready}} {
		if err := s.Volumes.Put(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil { // checkpoint: epoch 2
		t.Fatal(err)
	}
	s = open(t, dir)
	old, _ := os.ReadFile(filepath.Join(dir, "volumes", "id-1.json"))
	if err := s.Volumes.Put(Volume{ID: "id-1", Name: "a", Phase: Ready, CapacityBytes: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Volumes.Put(Volume{ID: "id-1", Name: "a", Phase: Ready, CapacityBytes: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Volumes.Drop("id-2"); err != nil {
		t.Fatal(err)
	}
	if err := s.Snapshots.Put(Snapshot{ID: "id-s", Name: "s", Phase: Ready}); err != nil {
		t.Fatal(err)
	}
	// The power loss: id-1's rename lost, id-2's removal lost, id-s's
	// new file empty.
	vols := filepath.Join(dir, "volumes")
	os.WriteFile(filepath.Join(vols, "id-1.json"), old, 0o600)
	os.WriteFile(filepath.Join(vols, "id-2.json"), []byte(`{"id":"id-2","name":"b","phase":"ready"}`), 0o600)
	os.WriteFile(filepath.Join(dir, "snapshots", "id-s.json"), nil, 0o600)
	// A torn entry after the last one is ignored.
	jf, err := os.OpenFile(filepath.Join(dir, "journal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	s.journal.mu.Lock()
	end := s.journal.off
	s.journal.mu.Unlock()
	jf.WriteAt([]byte(entryMagic+"garbage that is not an entry"), end)
	jf.Close()

	s2 := open(t, dir)
	if v, ok := s2.Volumes.Get("id-1"); !ok || v.Phase != Ready || v.CapacityBytes != 2 {
		t.Fatalf("id-1 after the power loss: %+v %v", v, ok)
	}
	if _, ok := s2.Volumes.Get("id-2"); ok {
		t.Fatal("dropped id-2 came back")
	}
	if v, ok := s2.Volumes.Get("id-3"); !ok || v.Phase != Ready {
		t.Fatalf("untouched id-3: %+v %v", v, ok)
	}
	if sn, ok := s2.Snapshots.Get("id-s"); !ok || sn.Phase != Ready {
		t.Fatalf("id-s after the power loss: %+v %v", sn, ok)
	}
	// That Open checkpointed: the entries are of an older epoch now, and
	// a record changed by hand after it is left as it is.
	os.WriteFile(filepath.Join(vols, "id-3.json"), []byte(`{"id":"id-3","name":"c","phase":"deleting"}`), 0o600)
	os.WriteFile(filepath.Join(vols, "id-1.json"), []byte(`{"id":"id-1","name":"a","phase":"deleting"}`), 0o600)
	s3 := open(t, dir)
	if v, _ := s3.Volumes.Get("id-1"); v.Phase != Deleting {
		t.Fatalf("an entry of an old epoch was applied again: %+v", v)
	}
}

// TestJournalConcurrentAndFull: commits from many goroutines (sharing
// syncs) and more entries than the journal holds (checkpoints on the way)
// all survive, with every record file lost after the last one.
func TestJournalConcurrentAndFull(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	const workers, each = 8, 400 // about two journals of entries
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				v := Volume{ID: fmt.Sprintf("id-%d", w), Name: fmt.Sprintf("n-%d", w), CapacityBytes: int64(i),
					Parameters: map[string]string{"pad": strings.Repeat("x", 2000)}}
				if err := s.Volumes.Put(v); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s.journal.mu.Lock()
	epoch := s.journal.epoch
	s.journal.mu.Unlock()
	if epoch < 2 {
		t.Fatalf("epoch %d: the journal never filled", epoch)
	}
	// A last change of each in one epoch, then every file lost: only
	// changes since the last checkpoint can be lost that way.
	for {
		for w := 0; w < workers; w++ {
			if err := s.Volumes.Put(Volume{ID: fmt.Sprintf("id-%d", w), Name: fmt.Sprintf("n-%d", w), CapacityBytes: each}); err != nil {
				t.Fatal(err)
			}
		}
		s.journal.mu.Lock()
		same := s.journal.epoch == epoch
		epoch = s.journal.epoch
		s.journal.mu.Unlock()
		if same {
			break
		}
	}
	for w := 0; w < workers; w++ {
		os.Remove(filepath.Join(dir, "volumes", fmt.Sprintf("id-%d.json", w)))
	}
	s2 := open(t, dir)
	for w := 0; w < workers; w++ {
		if v, ok := s2.Volumes.Get(fmt.Sprintf("id-%d", w)); !ok || v.CapacityBytes != each {
			t.Fatalf("id-%d: %+v %v, want the last write", w, v, ok)
		}
	}
}

// TestJournalDamagedHeader: after a journal whose header does not check
// is read by its entries' epochs, the next epoch is past all of them: the
// entries of its earlier life are never applied again, even where a new
// entry ends exactly where an old one began.
func TestJournalDamagedHeader(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	for _, v := range []Volume{{ID: "id-1", Name: "a", Phase: Ready}, {ID: "id-2", Name: "b", Phase: Ready}} {
		if err := s.Volumes.Put(v); err != nil {
			t.Fatal(err)
		}
	}
	jf, err := os.OpenFile(filepath.Join(dir, "journal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	jf.WriteAt([]byte("garbage!"), 0)
	jf.Close()
	s2 := open(t, dir)
	// The same length as id-1's entry: it ends where id-2's began.
	if err := s2.Volumes.Put(Volume{ID: "id-3", Name: "c", Phase: Ready}); err != nil {
		t.Fatal(err)
	}
	vols := filepath.Join(dir, "volumes")
	os.WriteFile(filepath.Join(vols, "id-2.json"), []byte(`{"id":"id-2","name":"b","phase":"deleting"}`), 0o600)
	os.Remove(filepath.Join(vols, "id-3.json"))
	s3 := open(t, dir)
	if v, ok := s3.Volumes.Get("id-3"); !ok || v.Phase != Ready {
		t.Fatalf("id-3, committed after the damage: %+v %v", v, ok)
	}
	if v, _ := s3.Volumes.Get("id-2"); v.Phase != Deleting {
		t.Fatalf("an entry from before the damage was applied: %+v", v)
	}
}
