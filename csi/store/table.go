package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/hostpath-csi/hostpath/fsops"
)

// ErrNameTaken is returned by Reserve when another record, ready or still
// being made, already has the name.
var ErrNameTaken = errors.New("the name is taken by a record being created")

// NameError says which name Reserve found taken; it unwraps to
// ErrNameTaken.
type NameError struct {
	Kind, Name string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("%s name %q is being created by another request", e.Kind, e.Name)
}

// Unwrap makes errors.Is(err, ErrNameTaken) true.
func (e *NameError) Unwrap() error { return ErrNameTaken }

// Table is one kind of record: a directory of JSON files named by id, and
// the index by id and by name. mu guards the index and is never held
// across I/O.
type Table[T Record[T]] struct {
	kind string
	tableDir
	journal *journal

	mu     sync.RWMutex
	byID   map[string]T
	byName map[string]string

	emptied []string // ids of empty records Open removed
}

// Emptied lists the ids of empty records that Open removed: creates that a
// power loss interrupted before their pending record reached the disk.
func (t *Table[T]) Emptied() []string { return t.emptied }

func newTable[T Record[T]](kind, dir string, valid func(string) bool) (*Table[T], error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Table[T]{kind: kind, tableDir: tableDir{name: filepath.Base(dir), dir: dir, valid: valid},
		byID: map[string]T{}, byName: map[string]string{}}, nil
}

// load reads every record. A file that does not parse is reported, not
// skipped: losing track of a volume silently is worse than not starting.
// Temporary files of an interrupted write are removed.
func (t *Table[T]) load() error {
	entries, err := os.ReadDir(t.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !t.valid(id) {
			if strings.HasPrefix(e.Name(), ".") {
				os.Remove(filepath.Join(t.dir, e.Name()))
			}
			continue
		}
		p := filepath.Join(t.dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if len(data) == 0 {
			// Only a PutPending record can come back empty from a power
			// loss (what Put wrote is in the journal, redone before this,
			// or was fsynced at a checkpoint): an unfinished create, whose
			// data the driver's start removes as owned by no record.
			if err := os.Remove(p); err != nil {
				return err
			}
			t.emptied = append(t.emptied, id)
			continue
		}
		var r T
		if err := json.Unmarshal(data, &r); err != nil {
			return fmt.Errorf("state file %s is damaged: %w", p, err)
		}
		t.byID[r.RecordID()] = r
		t.byName[r.RecordName()] = r.RecordID()
	}
	return nil
}

// Get returns a copy of the record with this id.
func (t *Table[T]) Get(id string) (T, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	r, ok := t.byID[id]
	return r.Clone(), ok
}

// ByName returns a copy of the record with this name.
func (t *Table[T]) ByName(name string) (T, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	id, ok := t.byName[name]
	if !ok {
		var zero T
		return zero, false
	}
	return t.byID[id].Clone(), true
}

// All returns copies of every record, sorted by id.
func (t *Table[T]) All() []T {
	t.mu.RLock()
	out := make([]T, 0, len(t.byID))
	for _, r := range t.byID {
		out = append(out, r.Clone())
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(a.RecordID(), b.RecordID()) })
	return out
}

// Reserve enters a new record in the index, without writing it, if no
// record has its name and check (run under the index lock, so two creates
// cannot both take the last bytes) agrees. The caller writes it with Put,
// or takes it back with Unreserve.
func (t *Table[T]) Reserve(r *T, check func(r *T, all map[string]T) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byName[(*r).RecordName()]; ok {
		return &NameError{Kind: t.kind, Name: (*r).RecordName()}
	}
	if check != nil {
		if err := check(r, t.byID); err != nil {
			return err
		}
	}
	t.byID[(*r).RecordID()] = (*r).Clone()
	t.byName[(*r).RecordName()] = (*r).RecordID()
	return nil
}

// Unreserve takes out of the index a reservation whose record was never
// written. The index is what answers "name taken", so it goes even when
// the state dir refuses every write.
func (t *Table[T]) Unreserve(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forget(id)
}

func (t *Table[T]) forget(id string) {
	if r, ok := t.byID[id]; ok && t.byName[r.RecordName()] == id {
		delete(t.byName, r.RecordName())
	}
	delete(t.byID, id)
}

// Check runs f with every record in view, under the index lock.
func (t *Table[T]) Check(f func(all map[string]T) error) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return f(t.byID)
}

// Put writes the record durably, then updates the index: the record file
// atomically, then the change into the journal, synced.
func (t *Table[T]) Put(r T) error { return t.put(r, true) }

// PutPending writes a record that is not final yet (a volume being
// created) atomically but not durably: a power loss may lose it, which
// leaves what a crash before it would, data that no record owns, and the
// next start removes that.
func (t *Table[T]) PutPending(r T) error { return t.put(r, false) }

func (t *Table[T]) put(r T, durable bool) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(t.dir, r.RecordID()+".json")
	if err := fsops.ReplaceFile(p, data, 0o600); err != nil {
		return err
	}
	if durable {
		if err := t.journal.commit(entry{Table: t.name, ID: r.RecordID(), Record: data}, p); err != nil {
			return err
		}
	}
	t.mu.Lock()
	t.byID[r.RecordID()] = r.Clone()
	t.byName[r.RecordName()] = r.RecordID()
	t.mu.Unlock()
	return nil
}

// Drop removes the record from disk, durably (through the journal), and
// then from the index.
func (t *Table[T]) Drop(id string) error {
	p := filepath.Join(t.dir, id+".json")
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := t.journal.commit(entry{Table: t.name, ID: id, Drop: true}, p); err != nil {
		return err
	}
	t.mu.Lock()
	t.forget(id)
	t.mu.Unlock()
	return nil
}

// Store is every table of the driver.
type Store struct {
	Volumes   *Table[Volume]
	Snapshots *Table[Snapshot]
	Groups    *Table[Group]
	journal   *journal
}

// Close checkpoints the journal and closes it; the store refuses writes
// after it.
func (s *Store) Close() error { return s.journal.close() }

// IDRules says which file names in each table are records; anything else
// is left alone (and dot-files, interrupted writes, are removed).
type IDRules struct {
	Volume, Snapshot, Group func(id string) bool
}

// Open makes the tables under dir (volumes/, snapshots/, groups/), redoes
// the journal's changes (dir/journal) that a power loss may have taken
// from the record files, and loads every record.
func Open(dir string, ids IDRules) (*Store, error) {
	var s Store
	var err error
	if s.Volumes, err = newTable[Volume]("volume", filepath.Join(dir, "volumes"), ids.Volume); err != nil {
		return nil, err
	}
	if s.Snapshots, err = newTable[Snapshot]("snapshot", filepath.Join(dir, "snapshots"), ids.Snapshot); err != nil {
		return nil, err
	}
	if s.Groups, err = newTable[Group]("group snapshot", filepath.Join(dir, "groups"), ids.Group); err != nil {
		return nil, err
	}
	tables := map[string]*tableDir{}
	for _, t := range []*tableDir{&s.Volumes.tableDir, &s.Snapshots.tableDir, &s.Groups.tableDir} {
		tables[t.name] = t
	}
	if s.journal, err = openJournal(filepath.Join(dir, "journal"), tables); err != nil {
		return nil, err
	}
	s.Volumes.journal, s.Snapshots.journal, s.Groups.journal = s.journal, s.journal, s.journal
	for _, load := range []func() error{s.Volumes.load, s.Snapshots.load, s.Groups.load} {
		if err := load(); err != nil {
			return nil, err
		}
	}
	return &s, nil
}
