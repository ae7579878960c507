package ext4

import (
	"fmt"
	"os"
	"time"

	"github.com/hostpath-csi/hostpath/format/internal/blank"
)

// Options are what a caller may choose of a new file system.
type Options struct {
	// UUID is the file system's; zero means a random one (each volume
	// gets its own, so two never look alike to blkid or the kernel).
	UUID [16]byte
	// Label is the volume name (at most 16 bytes).
	Label string
	// Now is the creation time; zero means time.Now().
	Now time.Time
	// RootMode is the root directory's permission bits; zero means 0755,
	// as mkfs.ext4 makes it.
	RootMode os.FileMode
}

// Info is what was made.
type Info struct {
	UUID          [16]byte
	Blocks        uint64 // 4 KiB blocks in the file system
	Groups        uint32
	Inodes        uint32
	JournalBlocks uint32
	FreeBlocks    uint64
}

// Feature bits (the kernel's fs/ext4/ext4.h names).
const (
	compatHasJournal = 0x0004
	compatExtAttr    = 0x0008
	compatDirIndex   = 0x0020

	incompatFiletype = 0x0002
	incompatExtents  = 0x0040

	roCompatSparseSuper = 0x0001
	roCompatLargeFile   = 0x0002
	roCompatHugeFile    = 0x0008
	roCompatDirNlink    = 0x0020
	roCompatExtraIsize  = 0x0040

	extentsFlag = 0x80000 // EXT4_EXTENTS_FL
)

// Format makes an empty ext4 file system with a journal in f, of f's
// size: a regular file (an image, sparse) or a block device. Only the
// metadata is written (a few blocks per group, the journal's superblock),
// so it takes milliseconds for any size; everything else must read as
// zeros, which Format makes sure of first: a file's range is punched to a
// hole (fallocate(2)), a device's is zeroed (BLKZEROOUT; on a loop device
// that allocates its backing file's blocks, so format an image file before
// attaching it, not the device after). The result is what
// mke2fs -t ext4 -b 4096 -I 256 -O ^resize_inode,^flex_bg,^metadata_csum,
// ^64bit -m 0 would make: e2fsck -fn finds it clean and the kernel mounts
// it read-write.
func Format(f *os.File, opt Options) (Info, error) {
	size, regular, err := blank.Size(f)
	if err != nil {
		return Info{}, err
	}
	geo, err := newGeometry(size)
	if err != nil {
		return Info{}, err
	}
	if len(opt.Label) > 16 {
		return Info{}, fmt.Errorf("label %q is longer than 16 bytes", opt.Label)
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
	return Info{UUID: opt.UUID, Blocks: geo.blocks, Groups: geo.groups, Inodes: geo.inodesPer * geo.groups,
		JournalBlocks: geo.journalBlocks, FreeBlocks: w.freeBlocks}, nil
}

// writer writes one file system's metadata.
type writer struct {
	f          *os.File
	geo        *geometry
	opt        Options
	freeBlocks uint64
}

func (w *writer) at(block uint64, p []byte) error {
	if _, err := w.f.WriteAt(p, int64(block)*blockSize); err != nil {
		return fmt.Errorf("writing block %d of %s: %w", block, w.f.Name(), err)
	}
	return nil
}

func (w *writer) write() error {
	geo := w.geo
	gdt := make([]byte, int(geo.gdtBlocks)*blockSize)
	freeInodes := uint64(0)
	for g := uint32(0); g < geo.groups; g++ {
		free := geo.groupBlocks(g) - geo.used(g)
		w.freeBlocks += uint64(free)
		usedInodes := uint32(0)
		dirs := uint16(0)
		if g == 0 {
			usedInodes, dirs = firstInode, 2
		}
		freeInodes += uint64(geo.inodesPer - usedInodes)
		d := gdt[int(g)*descSize:]
		le.PutUint32(d[0:], uint32(geo.blockBitmap(g)))
		le.PutUint32(d[4:], uint32(geo.inodeBitmap(g)))
		le.PutUint32(d[8:], uint32(geo.inodeTable(g)))
		le.PutUint16(d[12:], uint16(free))
		le.PutUint16(d[14:], uint16(geo.inodesPer-usedInodes))
		le.PutUint16(d[16:], dirs)
		if err := w.at(geo.blockBitmap(g), w.blockBitmap(g)); err != nil {
			return err
		}
		if err := w.at(geo.inodeBitmap(g), inodeBitmap(geo.inodesPer, usedInodes)); err != nil {
			return err
		}
	}
	if err := w.writeInodes(); err != nil {
		return err
	}
	if err := w.writeDirs(); err != nil {
		return err
	}
	if err := w.writeJournal(); err != nil {
		return err
	}
	// The superblock and descriptors last, so a formatter cut short
	// leaves nothing that looks like a file system.
	for g := uint32(0); g < geo.groups; g++ {
		if !hasSuper(g) {
			continue
		}
		sb := w.superblock(g, freeInodes)
		blk := make([]byte, blockSize)
		off := 0
		if g == 0 {
			off = 1024 // the boot sector's kilobyte comes first
		}
		copy(blk[off:], sb)
		if err := w.at(groupStart(g), blk); err != nil {
			return err
		}
		if err := w.at(groupStart(g)+1, gdt); err != nil {
			return err
		}
	}
	return nil
}

// blockBitmap marks group g's used blocks, and the bits past a short last
// group's end.
func (w *writer) blockBitmap(g uint32) []byte {
	geo := w.geo
	bm := make([]byte, blockSize)
	start := groupStart(g)
	mark := func(b uint64, n uint64) {
		for i := b - start; i < b-start+n; i++ {
			bm[i/8] |= 1 << (i % 8)
		}
	}
	mark(start, uint64(geo.overhead(g)))
	end := start + uint64(geo.groupBlocks(g))
	if g == 0 {
		mark(geo.rootBlock, 1+lostFoundSize)
	}
	for _, r := range geo.journal {
		if r.start >= start && r.start < end {
			mark(r.start, uint64(r.len))
		}
	}
	if geo.leaf >= start && geo.leaf < end && geo.leaf != 0 {
		mark(geo.leaf, 1)
	}
	mark(end, start+blocksPerGroup-end)
	return bm
}

// inodeBitmap marks the first used inodes of a group, and the padding past
// the group's inodes.
func inodeBitmap(per, used uint32) []byte {
	bm := make([]byte, blockSize)
	for i := uint32(0); i < used; i++ {
		bm[i/8] |= 1 << (i % 8)
	}
	for i := per; i < blocksPerGroup; i++ {
		bm[i/8] |= 1 << (i % 8)
	}
	return bm
}
