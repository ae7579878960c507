package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"

	"golang.org/x/sys/unix"
)

// Checkpoints: the record files written since the last one made durable,
// then a new epoch, so the journal's space can be written again.

// setDirty remembers the record file at path for the next checkpoint.
// j.mu is held, or the journal is not shared yet.
func (j *journal) setDirty(path string, f *os.File) {
	if old := j.dirty[path]; old != nil {
		// The file it wrote is replaced or removed: its content no
		// longer matters.
		old.Close()
	}
	j.dirty[path] = f
}

// forgetDirty closes the record files held for a checkpoint and forgets
// them.
func (j *journal) forgetDirty() {
	for _, f := range j.dirty {
		if f != nil {
			f.Close()
		}
	}
	clear(j.dirty)
}

// checkpoint runs a checkpoint once no commit is between its append and
// its rename.
func (j *journal) checkpoint() error {
	j.gate.Lock()
	defer j.gate.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.failed != nil {
		return j.failed
	}
	return j.checkpointLocked()
}

// checkpointLocked makes every change since the last checkpoint durable in
// the record files, then starts a new epoch. A failed fsync poisons the
// journal: the kernel may have dropped what it could not write, and only
// the journal still holds those changes. Any other failure (the header
// cannot be written on a file system turned read-only) leaves the journal
// as it was.
func (j *journal) checkpointLocked() error {
	poison := func(err error) error {
		j.failed = fmt.Errorf("checkpoint: %w", err)
		return j.failed
	}
	for p, f := range j.dirty {
		if f == nil {
			continue
		}
		if err := f.Sync(); err != nil {
			return poison(&os.PathError{Op: "fsync", Path: p, Err: err})
		}
	}
	for _, d := range j.dirs {
		if err := d.Sync(); err != nil {
			return poison(&os.PathError{Op: "fsync", Path: d.Name(), Err: err})
		}
	}
	var h [16]byte
	copy(h[:], journalMagic)
	binary.LittleEndian.PutUint64(h[4:], j.epoch+1)
	binary.LittleEndian.PutUint32(h[12:], crc32.Checksum(h[:12], castagnoli))
	if err := j.writeAt(h[:], 0); err != nil {
		return err
	}
	if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
		return poison(fmt.Errorf("journal %s: fdatasync: %w", j.path, err))
	}
	j.epoch++
	j.off = j.unit
	j.seq = 0
	j.forgetDirty()
	return nil
}

// err says why the journal refuses changes, or nil.
func (j *journal) err() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.failed
}

// close checkpoints and closes the journal; writes fail after it. A second
// close does nothing.
func (j *journal) close() error {
	j.gate.Lock()
	defer j.gate.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	err := j.failed
	if err == nil {
		err = j.checkpointLocked()
	}
	j.release()
	j.closed, j.failed = true, errClosed
	return err
}
