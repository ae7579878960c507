// Package logwrites reads the log a dm-log-writes target records (the
// kernel's Documentation/admin-guide/device-mapper/log-writes.rst and
// drivers/md/dm-log-writes.c): every write that reached the data device,
// in completion order, with its flush, FUA, discard and mark flags, so a
// test can rebuild the device as it was at any point a power loss could
// leave, as xfstests' replay-log does.
package logwrites

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// Entry flags.
const (
	Flush    = 1 << 0
	FUA      = 1 << 1
	Discard  = 1 << 2
	Mark     = 1 << 3
	Metadata = 1 << 4
)

const (
	magic   = 0x6a736677736872
	version = 1
)

// Entry is one logged write (or flush, discard, mark).
type Entry struct {
	Index      int
	Sector     uint64 // in the data device's sectors of SectorSize
	NrSectors  uint64
	Flags      uint64
	Mark       string // the name of a mark
	dataOffset int64  // where its data lies in the log
}

// Log is an opened log.
type Log struct {
	f          *os.File
	SectorSize int64
	Entries    []Entry
}

// Open reads the super block and every entry's header.
func Open(path string) (*Log, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sb := make([]byte, 28)
	if _, err := f.ReadAt(sb, 0); err != nil {
		f.Close()
		return nil, err
	}
	if binary.LittleEndian.Uint64(sb[0:]) != magic || binary.LittleEndian.Uint64(sb[8:]) != version {
		f.Close()
		return nil, fmt.Errorf("%s: not a dm-log-writes log (magic %x)", path, binary.LittleEndian.Uint64(sb[0:]))
	}
	l := &Log{f: f, SectorSize: int64(binary.LittleEndian.Uint32(sb[24:]))}
	n := binary.LittleEndian.Uint64(sb[16:])
	if l.SectorSize < 512 || l.SectorSize > 4096 {
		f.Close()
		return nil, fmt.Errorf("%s: sector size %d", path, l.SectorSize)
	}
	hdr := make([]byte, l.SectorSize)
	off := l.SectorSize
	for i := uint64(0); i < n; i++ {
		if _, err := f.ReadAt(hdr, off); err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: entry %d of %d at %d: %w", path, i, n, off, err)
		}
		e := Entry{Index: int(i), Sector: binary.LittleEndian.Uint64(hdr[0:]), NrSectors: binary.LittleEndian.Uint64(hdr[8:]),
			Flags: binary.LittleEndian.Uint64(hdr[16:])}
		dataLen := binary.LittleEndian.Uint64(hdr[24:])
		if e.Flags&Mark != 0 {
			if dataLen > uint64(l.SectorSize-32) {
				f.Close()
				return nil, fmt.Errorf("%s: entry %d: mark of %d bytes", path, i, dataLen)
			}
			e.Mark = string(hdr[32 : 32+dataLen])
		} else if dataLen != 0 {
			f.Close()
			return nil, fmt.Errorf("%s: entry %d has inline data (a DAX device?), which this reader does not replay", path, i)
		}
		off += l.SectorSize
		if e.Flags&Discard == 0 {
			e.dataOffset = off
			off += int64(e.NrSectors) * l.SectorSize
		}
		l.Entries = append(l.Entries, e)
	}
	return l, nil
}

// Close closes the log.
func (l *Log) Close() error { return l.f.Close() }

// Apply does entry e to dev: writes its data, or for a discard writes
// zeros (what a discarded range may read back as; the file systems under
// test do not rely on it).
func (l *Log) Apply(e Entry, dev *os.File) error {
	if e.NrSectors == 0 {
		return nil
	}
	n := int64(e.NrSectors) * l.SectorSize
	at := int64(e.Sector) * l.SectorSize
	if e.Flags&Discard != 0 {
		return zero(dev, at, n)
	}
	_, err := io.Copy(io.NewOffsetWriter(dev, at), io.NewSectionReader(l.f, e.dataOffset, n))
	return err
}

func zero(dev *os.File, at, n int64) error {
	z := make([]byte, min(n, 1<<20))
	for n > 0 {
		c := min(n, int64(len(z)))
		if _, err := dev.WriteAt(z[:c], at); err != nil {
			return err
		}
		at, n = at+c, n-c
	}
	return nil
}

// ApplyTorn does entry e to dev as a write torn by a power loss: only the
// sectors keep chooses (by their index in the write) reach dev, in no
// order a reader could tell. A discard is applied whole.
func (l *Log) ApplyTorn(e Entry, dev *os.File, keep func(sector int) bool) error {
	if e.Flags&Discard != 0 || e.NrSectors == 0 {
		return l.Apply(e, dev)
	}
	buf := make([]byte, l.SectorSize)
	for i := 0; i < int(e.NrSectors); i++ {
		if !keep(i) {
			continue
		}
		if _, err := l.f.ReadAt(buf, e.dataOffset+int64(i)*l.SectorSize); err != nil {
			return err
		}
		if _, err := dev.WriteAt(buf, (int64(e.Sector)+int64(i))*l.SectorSize); err != nil {
			return err
		}
	}
	return nil
}
