package ext4

import (
	"errors"
	"fmt"
)

// Fixed choices of this formatter: 4 KiB blocks, 256-byte inodes, one
// inode per 16 KiB of space (mke2fs's "default" type), 32-byte group
// descriptors (no 64bit feature, so at most 16 TiB).
const (
	blockSize      = 4096
	inodeSize      = 256
	bytesPerInode  = 16384
	blocksPerGroup = 8 * blockSize // one bitmap block maps a group
	descSize       = 32
	inodesPerBlock = blockSize / inodeSize
	firstInode     = 11 // inodes 1-10 are reserved
	rootInode      = 2
	journalInode   = 8
	lostFoundInode = 11
	lostFoundSize  = 4 // blocks, as mke2fs makes it

	// BlockSize is the block size of every file system Format makes.
	BlockSize = blockSize
	// MinSize is the smallest file system made: room for the smallest
	// journal jbd2 takes (1024 blocks) and some data.
	MinSize = 16 << 20
	// MaxSize is the largest: 2^32-1 blocks of 4 KiB, what the 32-bit
	// block counts of a file system without the 64bit feature hold.
	MaxSize = 1<<44 - blockSize
)

// ErrSize is wrapped by the error for a size this formatter does not make.
var ErrSize = errors.New("size not supported")

// geometry is where everything of a file system goes.
type geometry struct {
	blocks        uint64 // blocks in the file system (the last group may be shorter)
	groups        uint32
	inodesPer     uint32 // inodes per group
	itableBlocks  uint32 // inode table blocks per group
	gdtBlocks     uint32 // group descriptor table blocks
	journalBlocks uint32
	// journal lists the journal's runs of blocks (physical start,
	// length), in logical order; leaf is the extent leaf block when
	// they do not fit in the inode (0: none).
	journal []run
	leaf    uint64
	// rootBlock and lostFound are the directories' blocks.
	rootBlock, lostFound uint64
}

type run struct {
	start uint64
	len   uint32
}

// hasSuper reports whether group g holds a copy of the superblock and
// descriptors (sparse_super: groups 0, 1 and powers of 3, 5 and 7).
func hasSuper(g uint32) bool {
	if g <= 1 {
		return true
	}
	for _, base := range []uint32{3, 5, 7} {
		n := base
		for n < g {
			n *= base
		}
		if n == g {
			return true
		}
	}
	return false
}

// groupStart is group g's first block.
func groupStart(g uint32) uint64 { return uint64(g) * blocksPerGroup }

// groupBlocks is how many blocks group g has.
func (geo *geometry) groupBlocks(g uint32) uint32 {
	if g == geo.groups-1 {
		return uint32(geo.blocks - groupStart(g))
	}
	return blocksPerGroup
}

// overhead is how many blocks at group g's start hold metadata: the
// superblock and descriptor copies where there are some, the two bitmaps
// and the inode table.
func (geo *geometry) overhead(g uint32) uint32 {
	n := 2 + geo.itableBlocks
	if hasSuper(g) {
		n += 1 + geo.gdtBlocks
	}
	return n
}

// blockBitmap, inodeBitmap and inodeTable are group g's metadata blocks.
func (geo *geometry) blockBitmap(g uint32) uint64 {
	b := groupStart(g)
	if hasSuper(g) {
		b += 1 + uint64(geo.gdtBlocks)
	}
	return b
}
func (geo *geometry) inodeBitmap(g uint32) uint64 { return geo.blockBitmap(g) + 1 }
func (geo *geometry) inodeTable(g uint32) uint64  { return geo.blockBitmap(g) + 2 }

// dataStart is group g's first block after its metadata.
func (geo *geometry) dataStart(g uint32) uint64 {
	return groupStart(g) + uint64(geo.overhead(g))
}

// defaultJournal is mke2fs's journal size for a file system of that many
// 4 KiB blocks (ext2fs_default_journal_size).
func defaultJournal(blocks uint64) uint32 {
	switch {
	case blocks < 32768:
		return 1024
	case blocks < 256*1024:
		return 4096
	case blocks < 512*1024:
		return 8192
	case blocks < 4096*1024:
		return 16384
	case blocks < 8192*1024:
		return 32768
	case blocks < 16384*1024:
		return 65536
	case blocks < 32768*1024:
		return 131072
	}
	return 262144
}

// Blocks is how many blocks a file system Format makes in size bytes
// spans: fewer than size holds where the last group would be too short
// for its metadata (it is left out, as mke2fs does). A file system is as
// large as its device allows when it has this many: growing it into the
// rest would add a group with no room for data.
func Blocks(size int64) (uint64, error) {
	geo, err := newGeometry(size)
	if err != nil {
		return 0, err
	}
	return geo.blocks, nil
}

// newGeometry lays out a file system of size bytes.
func newGeometry(size int64) (*geometry, error) {
	if size < MinSize || size > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes (this formatter makes %d bytes to %d)", ErrSize, size, int64(MinSize), int64(MaxSize))
	}
	geo := &geometry{blocks: uint64(size) / blockSize}
	geo.groups = uint32((geo.blocks + blocksPerGroup - 1) / blocksPerGroup)
	for {
		ipg := (uint64(size)/bytesPerInode + uint64(geo.groups) - 1) / uint64(geo.groups)
		ipg = (ipg + inodesPerBlock - 1) / inodesPerBlock * inodesPerBlock
		ipg = max(ipg, inodesPerBlock)
		ipg = min(ipg, blocksPerGroup) // one bitmap block maps them
		geo.inodesPer = uint32(ipg)
		geo.itableBlocks = geo.inodesPer / inodesPerBlock
		geo.gdtBlocks = (geo.groups*descSize + blockSize - 1) / blockSize
		// A last group too short for its metadata and some data is left
		// out, as mke2fs does: the file system ends where the previous
		// group does.
		last := geo.groups - 1
		if last > 0 && geo.groupBlocks(last) < geo.overhead(last)+50 {
			geo.blocks = groupStart(last)
			geo.groups--
			continue
		}
		break
	}
	geo.journalBlocks = defaultJournal(geo.blocks)
	// Group 0's data: the root directory, lost+found, then the journal
	// from there on, in each group's data area, and its extent leaf when
	// it needs more than the inode's four extents.
	next := geo.dataStart(0)
	geo.rootBlock = next
	geo.lostFound = next + 1
	next += 1 + lostFoundSize
	g := uint32(0)
	need := geo.journalBlocks
	for need > 0 {
		end := groupStart(g) + uint64(geo.groupBlocks(g))
		if next < end {
			n := uint32(min(uint64(need), end-next, 32768)) // an extent maps at most 32768 blocks
			geo.journal = append(geo.journal, run{next, n})
			need -= n
			next += uint64(n)
			continue
		}
		g++
		if g == geo.groups {
			return nil, fmt.Errorf("%w: %d bytes leave no room for a journal of %d blocks", ErrSize, size, geo.journalBlocks)
		}
		next = geo.dataStart(g)
	}
	if len(geo.journal) > 4 {
		if len(geo.journal) > (blockSize-12)/12 {
			return nil, fmt.Errorf("%w: the journal would need %d extents", ErrSize, len(geo.journal))
		}
		end := groupStart(g) + uint64(geo.groupBlocks(g))
		if next >= end {
			return nil, fmt.Errorf("%w: no room for the journal's extent block", ErrSize)
		}
		geo.leaf = next
	}
	return geo, nil
}

// used is how many blocks of group g are taken: its metadata and the
// data this formatter allocates there.
func (geo *geometry) used(g uint32) uint32 {
	n := geo.overhead(g)
	start, end := groupStart(g), groupStart(g)+uint64(geo.groupBlocks(g))
	in := func(b uint64) bool { return b >= start && b < end }
	if g == 0 {
		n += 1 + lostFoundSize
	}
	for _, r := range geo.journal {
		if in(r.start) {
			n += r.len
		}
	}
	if geo.leaf != 0 && in(geo.leaf) {
		n++
	}
	return n
}
