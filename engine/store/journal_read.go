package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"io"
)

// headerState is what the journal's first bytes say.
type headerState int

const (
	// headerValid: the header checks; its epoch is the live one.
	headerValid headerState = iota
	// headerNone: the file holds nothing but zeros (or nothing): it was
	// never given a header, so no entry was ever committed to it (a
	// crash while it was first written full of zeros).
	headerNone
	// headerDamaged: something is written, but the header does not
	// check. The live epoch is then the newest any entry carries.
	headerDamaged
)

// scan is what reading the journal found.
type scan struct {
	header headerState
	// epoch is the live epoch: the header's, or, when the header is
	// damaged, the newest an entry carries (0 if no entry checks).
	epoch uint64
	// entries are the live epoch's, in order from its first.
	entries []entry
	// unreached counts entries of the live epoch that check but that
	// the chain from the first does not reach: written after one a
	// power loss tore (never acknowledged), or beyond damage.
	unreached int
}

// read reads the journal. The live epoch's entries run on from its first
// while they check; where one does not, the next may start on a later
// boundary of the append unit (an append after a sync), and is taken only
// if it is the next in sequence. The unit is at least minUnit and at most
// maxUnit, a multiple of minUnit: every such boundary is tried, so a
// journal written with any unit reads. Entries of other epochs never
// count: the header is written only after a checkpoint made every earlier
// entry durable in the record files.
//
// A damaged header is never taken for an empty journal: every entry
// carries its epoch, and epochs only grow, so the newest epoch an entry
// carries is the live one, or one whose every change a checkpoint already
// made durable (and applying its changes again in order changes nothing).
func (j *journal) read() (scan, error) {
	buf, err := io.ReadAll(io.NewSectionReader(j.f, 0, j.size))
	if err != nil {
		return scan{}, err
	}
	var sc scan
	switch {
	case len(buf) >= minUnit && string(buf[:4]) == journalMagic &&
		crc32.Checksum(buf[:12], castagnoli) == binary.LittleEndian.Uint32(buf[12:16]):
		sc.header, sc.epoch = headerValid, binary.LittleEndian.Uint64(buf[4:12])
	case !bytes.ContainsFunc(buf, func(r rune) bool { return r != 0 }):
		sc.header = headerNone
		return sc, nil
	default:
		sc.header, sc.epoch = headerDamaged, newestEpoch(buf)
	}
	var last uint64
	for off := minUnit; ; {
		e, end, ok := parseEntry(buf, off, sc.epoch)
		if !ok {
			// The rest of this unit may be the padding after a sync.
			e, end, ok = nextInSequence(buf, off, sc.epoch, last+1)
		}
		if !ok {
			break
		}
		sc.entries = append(sc.entries, e)
		last, off = e.Seq, end
	}
	sc.unreached = countEntries(buf, sc.epoch) - len(sc.entries)
	return sc, nil
}

// nextInSequence finds entry seq of epoch on a unit boundary after off:
// where an append after a sync put it.
func nextInSequence(buf []byte, off int, epoch, seq uint64) (entry, int, bool) {
	for b := alignUp(off+1, minUnit); b <= alignUp(off, maxUnit); b += minUnit {
		if e, end, ok := parseEntry(buf, b, epoch); ok && e.Seq == seq {
			return e, end, true
		}
	}
	return entry{}, 0, false
}

// entriesIn calls f with the epoch and offset of every entry in buf that
// checks, wherever it is.
func entriesIn(buf []byte, f func(epoch uint64, off int)) {
	for off := 0; ; off++ {
		i := bytes.Index(buf[off:], []byte(entryMagic))
		if i < 0 {
			return
		}
		off += i
		if off+entryHeadSize > len(buf) {
			return
		}
		epoch := binary.LittleEndian.Uint64(buf[off+4 : off+12])
		if _, _, ok := parseEntry(buf, off, epoch); ok {
			f(epoch, off)
		}
	}
}

// newestEpoch is the newest epoch an entry in buf carries, 0 if none.
func newestEpoch(buf []byte) uint64 {
	var newest uint64
	entriesIn(buf, func(epoch uint64, _ int) { newest = max(newest, epoch) })
	return newest
}

// countEntries counts the entries of epoch in buf that check.
func countEntries(buf []byte, epoch uint64) int {
	n := 0
	entriesIn(buf, func(e uint64, _ int) {
		if e == epoch {
			n++
		}
	})
	return n
}

// parseEntry reads the entry of epoch at off, if one is there whole.
func parseEntry(buf []byte, off int, epoch uint64) (entry, int, bool) {
	var e entry
	if off+entryHeadSize > len(buf) {
		return e, 0, false
	}
	h := buf[off : off+entryHeadSize]
	if string(h[:4]) != entryMagic || binary.LittleEndian.Uint64(h[4:12]) != epoch {
		return e, 0, false
	}
	end := off + entryHeadSize + int(binary.LittleEndian.Uint32(h[12:16]))
	if end > len(buf) || end < off || entrySum(h, buf[off+entryHeadSize:end]) != binary.LittleEndian.Uint32(h[16:20]) {
		return e, 0, false
	}
	if err := json.Unmarshal(buf[off+entryHeadSize:end], &e); err != nil {
		return e, 0, false
	}
	return e, end, true
}

// alignUp rounds off up to a multiple of unit.
func alignUp[T int | int64](off, unit T) T { return (off + unit - 1) / unit * unit }
