package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
)

// The journal makes a record change durable with one small overwrite and
// one fdatasync(2), where an atomic file replacement needs two fsyncs
// (the file, then its directory for the rename), each a journal commit of
// the file system (strace -T of block creates on the bench's journaled
// ext4 image: fdatasync 0.38-0.69 ms, each of those fsyncs 0.87-0.94 ms).
//
// Write-ahead order: a change's new record file is written under a
// temporary name first (where a full disk fails it, before anything
// changed), then its entry is appended to the journal and synced, and only
// then is the file renamed into place (or removed, for a drop). So the
// record files never show a change the journal could lose: XFS, and ext4
// mounted noauto_da_alloc, may put a rename on disk before the renamed
// file's content, and a record emptied that way is redone from its entry.
// A commit that fails leaves the record files as they were.
//
// The journal file is written full of zeros once, so an append changes no
// metadata and fdatasync only flushes the data. Concurrent commits share
// one fdatasync (group commit). An append after a sync starts on a new
// unit (the largest of 4 KiB, the page size and the file system's block
// size, which is what a write of part of it may rewrite whole), and the
// entries start on the unit after the header's: no write ever rewrites a
// unit holding entries already acknowledged, or the header, so a write
// torn by a power loss tears only entries nobody was told were durable.
//
// When the journal is full, when many record files are pending, and at
// every start, a checkpoint fsyncs the record files written since the last
// one (through the descriptors that wrote them, so a writeback error
// reported since is seen) and the table directories, then starts a new
// epoch: the header's epoch is raised and the entries of older epochs stop
// counting. Commits hold the gate shared from append to rename, a
// checkpoint holds it exclusively: no epoch is raised past an entry whose
// file is not in place yet. At start, before the tables are read, the
// entries of the current epoch are applied again to the record files in
// order. A header that does not check is never taken for an empty journal
// (see read).
type journal struct {
	path   string
	unit   int64 // the append unit; entries start at the second
	size   int64 // the file's length, written full of zeros once
	tables map[string]*tableDir
	dirs   []*os.File // the tables' directories, fsynced by checkpoints

	// gate is held shared by a commit from its append until its record
	// file is in place, and exclusively by a checkpoint.
	gate sync.RWMutex

	mu sync.Mutex // guards everything below but synced
	// f is open read-only, for reading and fdatasync: a file open for
	// writing would make a remount of the state dir read-only fail with
	// EBUSY. Writes open the file for each commit.
	f       *os.File
	epoch   uint64
	off     int64
	written uint64 // entries written, ever
	seq     uint64 // entries written in this epoch
	// dirty are the record files written since the last checkpoint, by
	// path, open (nil for a removal: the directory's fsync covers it).
	dirty  map[string]*os.File
	failed error // what is on disk is unknown until a restart
	closed bool

	syncMu sync.Mutex
	synced uint64 // entries known durable
}

// tableDir is what the journal knows of a table: its name in entries
// (its directory's), where its files are and which ids are records.
type tableDir struct {
	name  string
	dir   string
	valid func(id string) bool
}

const (
	// DefaultJournalSize is the journal's length unless Options say.
	DefaultJournalSize = 4 << 20
	// The append unit is a multiple of minUnit, at most maxUnit: a
	// reader tries every minUnit boundary up to the next maxUnit one.
	// (A block size above it is a network file system's transfer size,
	// not a unit its server writes whole.)
	minUnit       = 4096
	maxUnit       = 64 << 10
	journalMagic  = "HPJ1"
	entryMagic    = "HPE1"
	entryHeadSize = 4 + 8 + 4 + 4 // magic, epoch, payload length, crc
	// maxDirty bounds the record files a checkpoint fsyncs, and the
	// descriptors kept open for it.
	maxDirty = 1024
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errCheckpointDue is append's answer when the journal must be
// checkpointed first.
var errCheckpointDue = errors.New("checkpoint due")

// entrySum is an entry's checksum: of its epoch and length (head[4:16])
// and its payload.
func entrySum(head, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(head[4:16], castagnoli), castagnoli, payload)
}

// entry is one change: a record's new JSON, or its removal. Seq counts the
// epoch's entries from 1; entries written before it existed have none.
type entry struct {
	Table  string          `json:"t"`
	ID     string          `json:"id"`
	Seq    uint64          `json:"n,omitempty"`
	Record json.RawMessage `json:"r,omitempty"`
	Drop   bool            `json:"d,omitempty"`
}

func (e entry) path(t *tableDir) string { return filepath.Join(t.dir, e.ID+".json") }

// openJournal opens (or makes) the journal at path, applies the current
// epoch's entries to the tables' files and checkpoints. What it found
// beyond that (a damaged header, entries it could not reach) is in notes.
func openJournal(path string, tables map[string]*tableDir, size int64) (_ *journal, notes []string, retErr error) {
	j := &journal{path: path, tables: tables, dirty: map[string]*os.File{}}
	defer func() {
		if retErr != nil {
			j.release()
		}
	}()
	for _, t := range tables {
		d, err := os.Open(t.dir)
		if err != nil {
			return nil, nil, err
		}
		j.dirs = append(j.dirs, d)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, err
	}
	j.f = f
	if j.unit, err = appendUnit(f); err != nil {
		return nil, nil, &os.PathError{Op: "fstatfs", Path: path, Err: err}
	}
	if testUnit > 0 {
		j.unit = testUnit
	}
	// A journal made longer than size (by a start with another size) is
	// read and used whole: its entries may lie anywhere in it.
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	j.size = max(size, st.Size, 4*j.unit)
	sc, err := j.read()
	if err != nil {
		return nil, nil, err
	}
	switch {
	case sc.header == headerDamaged:
		notes = append(notes, fmt.Sprintf("journal %s: its header is damaged; its entries were read by their own epochs (the newest, %d, has %d in sequence, applied again, and %d out of reach of the sequence, not applied); nothing was zeroed", path, sc.epoch, len(sc.entries), sc.unreached))
	case sc.unreached > 0:
		notes = append(notes, fmt.Sprintf("journal %s: %d entries of the live epoch lie beyond one that does not check and were not applied: a power loss tore a write that was never acknowledged (or the disk damaged the journal)", path, sc.unreached))
	}
	// The epoch the checkpoint below raises: past every epoch an entry
	// carries, so no entry written before counts again.
	j.epoch = sc.epoch
	for _, e := range sc.entries {
		if err := j.redo(e); err != nil {
			return nil, nil, err
		}
	}
	if st.Size < j.size {
		// Written, not just allocated: an overwrite of written blocks
		// changes no metadata, so fdatasync does not commit the file
		// system's journal. What is written is kept: only the part a
		// crash during the first fill left out is written.
		if err := j.writeAt(make([]byte, j.size-st.Size), st.Size); err != nil {
			return nil, nil, err
		}
		if err := f.Sync(); err != nil {
			return nil, nil, &os.PathError{Op: "fsync", Path: path, Err: err}
		}
		if err := fsops.SyncDir(filepath.Dir(path)); err != nil {
			return nil, nil, err
		}
	}
	j.mu.Lock()
	err = j.checkpointLocked()
	j.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	return j, notes, nil
}

// testUnit, when a test sets it, is the append unit of journals opened.
var testUnit int64

// appendUnit is what a write into part of it may rewrite whole: the
// largest of minUnit, the page size and the file system's block size,
// rounded up to a multiple of minUnit and capped at maxUnit.
func appendUnit(f *os.File) (int64, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &sfs); err != nil {
		return 0, err
	}
	u := max(int64(minUnit), int64(unix.Getpagesize()), sfs.Bsize)
	return min(alignUp(u, minUnit), maxUnit), nil
}

// release closes every descriptor the journal holds.
func (j *journal) release() {
	for _, d := range j.dirs {
		d.Close()
	}
	j.forgetDirty()
	if j.f != nil {
		j.f.Close()
	}
}

// redo applies one entry to the record files again, not durably: the
// checkpoint that follows makes them durable. An entry for a table or an
// id the driver's rules do not take (a release with other rules wrote it,
// or a hand) is not applied: it is kept in the rejected directory, where
// Open reports it as damage, before the checkpoint stops it counting.
func (j *journal) redo(e entry) error {
	t, ok := j.tables[e.Table]
	if !ok || !t.valid(e.ID) {
		return j.reject(e)
	}
	f, err := placeEntry(e, t)
	if err != nil {
		return err
	}
	j.setDirty(e.path(t), f)
	return nil
}

// reject keeps entry e, durably, under a name of its epoch and sequence
// in the rejected directory beside the journal.
func (j *journal) reject(e entry) error {
	dir := rejectedDir(filepath.Dir(j.path))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return fsops.WriteFileAtomic(filepath.Join(dir, fmt.Sprintf("%d-%d.json", j.epoch, e.Seq)), data, 0o600)
}

// rejectedDir holds the journal entries redo would not apply.
func rejectedDir(meta string) string { return filepath.Join(meta, "rejected") }

// placeEntry makes the record file say what e says: the new record put in
// place, or the file removed. It returns the open record file.
func placeEntry(e entry, t *tableDir) (*os.File, error) {
	p := e.path(t)
	if e.Drop {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, nil
	}
	s, err := fsops.StageFile(p, e.Record, 0o600)
	if err != nil {
		return nil, err
	}
	return s.Place()
}

// ErrUncertain is wrapped by the error of a commit whose entry was
// written but whose sync failed: the entry may have reached the disk or
// not, so the change may stand after the next start (which redoes it) or
// not. The journal refuses every change after that until a restart, so a
// caller leaves what it made in place: whichever way the start decides,
// it finds the record and the data agreeing (a record redone as creating
// or deleting has its data cleared; one redone as ready has its data).
var ErrUncertain = errors.New("whether the change stands is decided at the driver's next start")

// commit makes e durable and then, still before any checkpoint can start,
// runs place, which puts the change in the record files. If the entry
// cannot be written place does not run, and nothing changed. If it was
// written but its sync failed, place does not run and the change is
// uncertain (ErrUncertain). If place fails after the sync, the change
// stands (the next start redoes it from the journal). After either of
// the last two the journal refuses further changes until a restart.
func (j *journal) commit(e entry, place func() (*os.File, error)) error {
	path := e.path(j.tables[e.Table])
	j.gate.RLock()
	seq, err := j.append(&e)
	for errors.Is(err, errCheckpointDue) {
		j.gate.RUnlock()
		if err := j.checkpoint(); err != nil {
			return err
		}
		j.gate.RLock()
		seq, err = j.append(&e)
	}
	defer j.gate.RUnlock()
	if err != nil {
		return err
	}
	if err := j.syncTo(seq); err != nil {
		//nolint:errorlint // both wrapped: csi maps ErrUncertain, and the errno stays visible to errors.Is
		return fmt.Errorf("%w (%w)", err, ErrUncertain)
	}
	f, err := place()
	j.mu.Lock()
	defer j.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("record %s: committed to the journal, but putting it in place failed (a restart redoes it): %w", path, err)
		if j.failed == nil {
			j.failed = err
		}
		return err
	}
	j.setDirty(path, f)
	return nil
}

// append writes e after the last entry and returns its sequence number,
// or errCheckpointDue when the journal has no room for it or enough
// record files wait for a checkpoint.
func (j *journal) append(e *entry) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed != nil {
		return 0, j.failed
	}
	e.Seq = j.seq + 1
	payload, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	rec := make([]byte, entryHeadSize+len(payload))
	if j.off+int64(len(rec)) > j.size || len(j.dirty) >= maxDirty {
		if j.off == j.unit && len(j.dirty) == 0 {
			return 0, fmt.Errorf("journal %s: a record of %d bytes does not fit", j.path, len(payload))
		}
		return 0, errCheckpointDue
	}
	copy(rec, entryMagic)
	binary.LittleEndian.PutUint64(rec[4:], j.epoch)
	binary.LittleEndian.PutUint32(rec[12:], uint32(len(payload)))
	copy(rec[entryHeadSize:], payload)
	binary.LittleEndian.PutUint32(rec[16:], entrySum(rec, payload))
	// A failed write leaves at most a torn entry, which reading stops
	// at, and the next commit overwrites it.
	if err := j.writeAt(rec, j.off); err != nil {
		return 0, err
	}
	j.off += int64(len(rec))
	j.seq++
	j.written++
	return j.written, nil
}

// syncTo returns once entry seq is durable. One fdatasync covers every
// entry written before it started, so commits that wait here together
// cost one sync.
func (j *journal) syncTo(seq uint64) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.synced >= seq {
		return nil
	}
	j.mu.Lock()
	target, failed := j.written, j.failed
	// What is appended from now on may not be in this sync: it starts
	// on a block of its own, so a torn write of it cannot reach back
	// into entries this sync acknowledges.
	j.off = alignUp(j.off, j.unit)
	j.mu.Unlock()
	if failed != nil {
		return failed
	}
	if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
		// After a failed sync the kernel may have dropped the dirty
		// pages: nothing written so far can be trusted to be on disk.
		err = fmt.Errorf("journal %s: fdatasync: %w", j.path, err)
		j.mu.Lock()
		if j.failed == nil {
			j.failed = err
		}
		j.mu.Unlock()
		return err
	}
	j.synced = target
	return nil
}

// writeAt writes p at off through a descriptor of its own.
func (j *journal) writeAt(p []byte, off int64) error {
	f, err := os.OpenFile(j.path, os.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(p, off)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// errClosed is what a closed store answers.
var errClosed = errors.New("the state store is closed")
