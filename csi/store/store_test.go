package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
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
	// A pending record is on disk (not durably) and in the index.
	if err := s.Volumes.Reserve(&v, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Volumes.PutPending(v); err != nil {
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

func TestDamagedRecordStopsOpen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Volumes.Put(Volume{ID: "id-1", Name: "n"}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "volumes", "id-1.json"), []byte("{garbage"), 0o600)
	if _, err := Open(dir, IDRules{Volume: anyID, Snapshot: anyID, Group: anyID}); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("a damaged record must stop Open: %v", err)
	}
}

// TestEmptyPendingRecordRemoved: an empty record, what a power loss can
// leave of a PutPending write, is removed at Open and reported, not
// taken for damage.
func TestEmptyPendingRecordRemoved(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	p := filepath.Join(dir, "volumes", "id-9.json")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir)
	if got := s.Volumes.Emptied(); len(got) != 1 || got[0] != "id-9" {
		t.Fatalf("emptied %v", got)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("empty record still there: %v", err)
	}
}
