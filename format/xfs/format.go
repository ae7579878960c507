package xfs

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"slices"
	"time"

	"github.com/hostpath-csi/hostpath/format/internal/blank"
)

// Options are what a caller may choose of a new file system.
type Options struct {
	// UUID is the file system's; zero means a random one. (XFS refuses to
	// mount two file systems of one UUID at once unless told nouuid: a
	// clone of an image keeps its source's.)
	UUID [16]byte
	// Now is the creation time; zero means time.Now().
	Now time.Time
	// RootMode is the root directory's permission bits; zero means 0755,
	// as mkfs.xfs makes it.
	RootMode os.FileMode
}

// Info is what was made.
type Info struct {
	UUID       [16]byte
	Blocks     uint64 // 4 KiB blocks in the file system
	AGCount    uint32
	AGBlocks   uint32
	LogBlocks  uint32
	FreeBlocks uint64 // sb_fdblocks
}

var (
	be         = binary.BigEndian
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// Magic numbers and flags (the kernel's fs/xfs/libxfs/xfs_format.h).
const (
	sbMagic   = 0x58465342 // XFSB
	agfMagic  = 0x58414746 // XAGF
	agiMagic  = 0x58414749 // XAGI
	agflMagic = 0x5841464c // XAFL
	bnoMagic  = 0x41423342 // AB3B: by-block free space, v5
	cntMagic  = 0x41423343 // AB3C: by-count free space, v5
	inoMagic  = 0x49414233 // IAB3: inodes, v5
	dinMagic  = 0x494e     // IN

	// sb_versionnum: version 5 with the NLINK, ALIGN, DIRV2, LOGV2,
	// EXTFLG, SECTOR and MOREBITS bits, as mkfs.xfs sets them for 4 KiB
	// sectors.
	versionNum = 0xbca5
	// sb_features2: LAZYSBCOUNT, ATTR2, PROJID32BIT, CRC.
	features2 = 0x18a
	// sb_features_incompat: FTYPE, BIGTIME.
	incompat = 0x9

	nullAG    = 0xffffffff // NULLAGBLOCK, NULLAGINO
	fmtLocal  = 1          // XFS_DINODE_FMT_LOCAL
	fmtExtent = 2          // XFS_DINODE_FMT_EXTENTS
	newRTBM   = 0x4        // XFS_DIFLAG_NEWRTBM
	bigtime   = 0x8        // XFS_DIFLAG2_BIGTIME
	// btree block header of a v5 short-form block, and its crc's place.
	btreeHdr = 56
	btreeCRC = 52
)

// Format makes an empty XFS in f, of f's size: a regular file (an image,
// sparse) or a block device. Only the metadata is written; everything
// else must read as zeros, which Format makes sure of first, as
// format/ext4 does (a file punched to a hole, a device zeroed). The
// primary superblock is written last, so a formatter cut short leaves
// nothing that mounts. The result is what mkfs.xfs makes with the options
// the package comment names: xfs_repair -n finds it clean and the kernel
// mounts it read-write.
func Format(f *os.File, opt Options) (Info, error) {
	size, regular, err := blank.Size(f)
	if err != nil {
		return Info{}, err
	}
	geo, err := newGeometry(size)
	if err != nil {
		return Info{}, err
	}
	if err := blank.Defaults(&opt.UUID, &opt.RootMode, &opt.Now); err != nil {
		return Info{}, err
	}
	if err := blank.Zero(f, size, regular); err != nil {
		return Info{}, err
	}
	w := &writer{f: f, geo: geo, opt: opt}
	if err := w.write(); err != nil {
		return Info{}, err
	}
	if err := f.Sync(); err != nil {
		return Info{}, fmt.Errorf("syncing %s: %w", f.Name(), err)
	}
	return Info{UUID: opt.UUID, Blocks: geo.blocks, AGCount: geo.agCount, AGBlocks: geo.agBlocks,
		LogBlocks: geo.logBlocks, FreeBlocks: w.free}, nil
}

// writer writes one file system's metadata.
type writer struct {
	f    *os.File
	geo  *geometry
	opt  Options
	free uint64 // sb_fdblocks: free extents and the AGFLs' blocks
}

// at writes p at group a's block b.
func (w *writer) at(a, b uint32, p []byte) error {
	if _, err := w.f.WriteAt(p, int64(w.geo.daddr(a, b))*512); err != nil {
		return fmt.Errorf("writing block %d of group %d of %s: %w", b, a, w.f.Name(), err)
	}
	return nil
}

func (w *writer) write() error {
	geo := w.geo
	for a := uint32(0); a < geo.agCount; a++ {
		l := geo.layout(a)
		var freeBlks, longest uint32
		for _, e := range l.free {
			freeBlks += e.len
			longest = max(longest, e.len)
		}
		w.free += uint64(freeBlks) + agflFill
		blocks := []struct {
			b uint32
			p []byte
		}{
			{1, w.agf(a, freeBlks, longest)},
			{2, w.agi(a, l)},
			{3, w.agfl(a, l)},
			{bnoRoot, w.freeBtree(a, bnoRoot, bnoMagic, l.free)},
			{cntRoot, w.freeBtree(a, cntRoot, cntMagic, byCount(l.free))},
			{inoRoot, w.inoBtree(a, l)},
		}
		for _, blk := range blocks {
			if err := w.at(a, blk.b, blk.p); err != nil {
				return err
			}
		}
		if l.chunk.len != 0 {
			if err := w.at(a, l.chunk.start, w.inodes(l.chunk)); err != nil {
				return err
			}
		}
	}
	if err := w.at(geo.logAG, geo.layout(geo.logAG).log.start, w.logHead()); err != nil {
		return err
	}
	// The superblock copies last, the primary's at the very end.
	sb := w.superblock()
	for a := geo.agCount; a > 0; a-- {
		if err := w.at(a-1, 0, sb); err != nil {
			return err
		}
	}
	return nil
}

// byCount sorts free extents as the by-count btree keys them: by length,
// then start.
func byCount(free []extent) []extent {
	return slices.SortedFunc(slices.Values(free), func(a, b extent) int {
		return cmp.Or(cmp.Compare(a.len, b.len), cmp.Compare(a.start, b.start))
	})
}

// sealed stores the CRC32c of p, with its own four bytes at off taken as
// zero, at off, little-endian (xfs_update_cksum).
func sealed(p []byte, off int) []byte {
	clear(p[off : off+4])
	binary.LittleEndian.PutUint32(p[off:], crc32.Checksum(p, castagnoli))
	return p
}

// sector is one zeroed 4 KiB sector (or block).
func sector() []byte { return make([]byte, SectorSize) }
