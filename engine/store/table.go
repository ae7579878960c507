package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
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

// testHookPlaced, when set by a test, runs the moment a record file has
// been renamed into place: where a power loss would find it there.
var testHookPlaced func(path string)

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

	damaged []Damaged // found by load
}

// Damaged is a record file that does not hold its record: empty, not
// JSON, another id's, unreadable (EIO), or not a regular file. Since every
// change is in the journal before the file is replaced, no crash leaves
// one; a disk that lost or mangled a written block, or a hand, did. Its
// data is kept: nothing is deleted on the strength of a record that cannot
// be read. A journal entry the id rules refused is one too (its Path is
// the kept copy).
type Damaged struct {
	ID, Path, Problem string
}

// Damaged lists the records load found damaged.
func (t *Table[T]) Damaged() []Damaged { return t.damaged }

// IsDamaged says whether the record with this id is damaged.
func (t *Table[T]) IsDamaged(id string) bool {
	for _, d := range t.damaged {
		if d.ID == id {
			return true
		}
	}
	return false
}

func newTable[T Record[T]](kind, dir string, valid func(string) bool) (*Table[T], error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &Table[T]{kind: kind, tableDir: tableDir{name: filepath.Base(dir), dir: dir, valid: valid},
		byID: map[string]T{}, byName: map[string]string{}}, nil
}

// load reads every record. A file that does not hold one is listed as
// damaged and left where it is. Temporary files of an interrupted write
// are removed.
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
		if !e.Type().IsRegular() {
			// The driver writes only regular files: a symlink (even one
			// that resolves) or a directory under a record's name is
			// not one of its records.
			t.damaged = append(t.damaged, Damaged{ID: id, Path: p, Problem: fmt.Sprintf("it is not a regular file but a %s", fileKind(e.Type()))})
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.damaged = append(t.damaged, Damaged{ID: id, Path: p, Problem: "the file cannot be read: " + err.Error()})
			continue
		}
		var r T
		switch err := json.Unmarshal(data, &r); {
		case len(data) == 0:
			t.damaged = append(t.damaged, Damaged{ID: id, Path: p, Problem: "the file is empty"})
			continue
		case err != nil:
			t.damaged = append(t.damaged, Damaged{ID: id, Path: p, Problem: "the file is not a record: " + err.Error()})
			continue
		case r.RecordID() != id:
			t.damaged = append(t.damaged, Damaged{ID: id, Path: p, Problem: fmt.Sprintf("the file holds the record of %q", r.RecordID())})
			continue
		}
		t.byID[r.RecordID()] = r
		t.byName[r.RecordName()] = r.RecordID()
	}
	return nil
}

// fileKind names a file type for a message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m.IsDir():
		return "directory"
	default:
		return "special file"
	}
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

// Put writes the record durably, then updates the index: the new file
// staged, the change committed to the journal, the file renamed into
// place. If it fails before the commit nothing changed; if the journal's
// sync fails, the change is uncertain (ErrUncertain) and the index is left
// as it was; if the rename fails after the commit, the index shows the
// change anyway, since the next start redoes it.
func (t *Table[T]) Put(r T) error {
	committed, err := t.write(r)
	if committed {
		t.Index(r)
	}
	return err
}

// PutUnindexed writes the record durably as Put does but leaves the index
// as it was, for a record that must not be seen before what it describes
// exists: the caller shows it with Index then.
func (t *Table[T]) PutUnindexed(r T) error {
	_, err := t.write(r)
	return err
}

// Index shows r in the index.
func (t *Table[T]) Index(r T) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byID[r.RecordID()]; ok && old.RecordName() != r.RecordName() && t.byName[old.RecordName()] == r.RecordID() {
		delete(t.byName, old.RecordName())
	}
	t.byID[r.RecordID()] = r.Clone()
	t.byName[r.RecordName()] = r.RecordID()
}

// write commits r and puts its file in place, and says whether the commit
// happened.
func (t *Table[T]) write(r T) (bool, error) {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return false, err
	}
	e := entry{Table: t.name, ID: r.RecordID(), Record: data}
	p := e.path(&t.tableDir)
	staged, err := fsops.StageFile(p, data, 0o600)
	if err != nil {
		return false, err
	}
	committed := false
	err = t.journal.commit(e, func() (*os.File, error) {
		committed = true
		f, err := staged.Place()
		if err == nil && testHookPlaced != nil {
			testHookPlaced(p)
		}
		return f, err
	})
	if !committed {
		staged.Abort()
	}
	return committed, err
}

// Drop removes the record durably: its removal committed to the journal,
// then its file removed and the index entry. If it fails before the
// commit nothing changed; if the journal's sync fails, the removal is
// uncertain (ErrUncertain) and the index is left as it was.
func (t *Table[T]) Drop(id string) error {
	e := entry{Table: t.name, ID: id, Drop: true}
	placed := false
	err := t.journal.commit(e, func() (*os.File, error) {
		placed = true
		return placeEntry(e, &t.tableDir)
	})
	if placed {
		t.mu.Lock()
		t.forget(id)
		t.mu.Unlock()
	}
	return err
}

// Store is every table of the driver.
type Store struct {
	Volumes   *Table[Volume]
	Snapshots *Table[Snapshot]
	Groups    *Table[Group]
	// Standbys are the copies this node keeps of other nodes' volumes.
	Standbys *Table[Standby]
	journal  *journal

	// rejected are the journal entries redo kept and did not apply.
	rejected []Damaged
	// notes says what Open found in the journal beyond its entries: a
	// damaged header, entries out of reach.
	notes []string
}

// Notes says what Open found and repaired in the journal, for the start
// log: a damaged header read by its entries' epochs, or entries beyond a
// torn one. Empty when the journal was as a clean run leaves it.
func (s *Store) Notes() []string { return s.notes }

// Close checkpoints the journal and closes it; the store refuses writes
// after it.
func (s *Store) Close() error { return s.journal.close() }

// Err says why the store refuses every change (a failed sync, a record
// that could not be put in place after its commit, Close), or nil: a
// health check and Probe report it, since only a restart clears it.
func (s *Store) Err() error { return s.journal.err() }

// AwaitingCheckpoint counts the record files changed since the last
// checkpoint; the journal holds each open until then.
func (s *Store) AwaitingCheckpoint() int {
	s.journal.mu.Lock()
	defer s.journal.mu.Unlock()
	return len(s.journal.dirty)
}

// Damaged lists every damaged record file, of every table.
func (s *Store) Damaged() []Damaged {
	return slices.Concat(s.Volumes.Damaged(), s.Snapshots.Damaged(), s.Groups.Damaged(), s.Standbys.Damaged(), s.rejected)
}

// IDRules says which file names in each table are records; anything else
// is left alone (and dot-files, interrupted writes, are removed).
type IDRules struct {
	Volume, Snapshot, Group func(id string) bool
}

// Options tune a store. JournalSize is the journal's length (zero:
// DefaultJournalSize); a small one checkpoints often, for tests that
// cross many checkpoints and epochs.
type Options struct {
	JournalSize int64
}

// Open makes the tables under dir (volumes/, snapshots/, groups/,
// standbys/: a standby is named by a volume id), redoes
// the journal's changes (dir/journal) that a power loss may have taken
// from the record files, and loads every record.
func Open(dir string, ids IDRules, opts ...Options) (*Store, error) {
	size := int64(DefaultJournalSize)
	for _, o := range opts {
		if o.JournalSize > 0 {
			size = o.JournalSize
		}
	}
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
	if s.Standbys, err = newTable[Standby]("standby", filepath.Join(dir, "standbys"), ids.Volume); err != nil {
		return nil, err
	}
	// The directories just made, and their names in the state root,
	// are durable before any record is written into them.
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := fsops.SyncDir(d); err != nil {
			return nil, err
		}
	}
	tables := map[string]*tableDir{}
	for _, t := range []*tableDir{&s.Volumes.tableDir, &s.Snapshots.tableDir, &s.Groups.tableDir, &s.Standbys.tableDir} {
		tables[t.name] = t
	}
	if s.journal, s.notes, err = openJournal(filepath.Join(dir, "journal"), tables, size); err != nil {
		return nil, err
	}
	if s.rejected, err = loadRejected(dir); err != nil {
		s.journal.close()
		return nil, err
	}
	s.Volumes.journal, s.Snapshots.journal, s.Groups.journal, s.Standbys.journal = s.journal, s.journal, s.journal, s.journal
	for _, load := range []func() error{s.Volumes.load, s.Snapshots.load, s.Groups.load, s.Standbys.load} {
		if err := load(); err != nil {
			s.journal.close()
			return nil, err
		}
	}
	return &s, nil
}

// loadRejected lists the journal entries kept in the rejected directory,
// this start's and earlier ones', until a person moves them away.
func loadRejected(meta string) ([]Damaged, error) {
	dir := rejectedDir(meta)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Damaged
	for _, f := range entries {
		p := filepath.Join(dir, f.Name())
		var e entry
		data, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(data, &e)
		}
		problem := fmt.Sprintf("a journal entry for %s %q that this driver's id rules do not take: not applied, kept here", e.Table, e.ID)
		if err != nil {
			problem = "a kept journal entry that cannot be read: " + err.Error()
		}
		out = append(out, Damaged{ID: e.ID, Path: p, Problem: problem})
	}
	return out, nil
}
