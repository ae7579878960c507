package xfs

import (
	"errors"
	"fmt"
	"math/bits"
)

const (
	// BlockSize is the file system block size made (4 KiB).
	BlockSize = 4096
	// SectorSize is the sector size made: 4 KiB, the logical block size
	// of an image volume's loop device (a sector size smaller than the
	// device's is refused at mount).
	SectorSize = 4096
	inodeSize  = 512
	inopblock  = BlockSize / inodeSize // inodes per block
	chunkInos  = 64                    // inodes per chunk (XFS_INODES_PER_CHUNK)
	chunkBlks  = chunkInos / inopblock // blocks per inode chunk

	// MinSize is the smallest file system made: mkfs.xfs's floor since
	// xfsprogs 5.19 (smaller ones cannot hold its default log well).
	MinSize = 300 << 20
	// MaxSize is the largest: the range of the loop devices and images
	// the driver makes (the same as format/ext4's).
	MaxSize = 1<<44 - BlockSize

	// Per allocation group, in blocks: the superblock, AGF, AGI and AGFL
	// (one 4 KiB sector each), then the roots of the by-block and
	// by-count free-space btrees and of the inode btree.
	bnoRoot   = 4
	cntRoot   = 5
	inoRoot   = 6
	firstFree = 7
	// agflFill is what the AGFL holds: xfs_alloc_min_freelist for
	// one-level free-space btrees (two blocks for each), as mkfs.xfs
	// leaves it.
	agflFill = 4
	// inoAlign is sb_inoalignmt: inode chunks start on 16 KiB
	// (XFS_INODE_BIG_CLUSTER_SIZE for 512-byte inodes).
	inoAlign = 4

	minAGBlocks = 64                      // XFS_MIN_AG_BLOCKS: the kernel's growfs makes no shorter group
	mkfsAGMin   = 16 << 20 / BlockSize    // XFS_AG_MIN_BLOCKS: mkfs.xfs drops a shorter tail
	maxAGBlocks = (1<<40 - 1) / BlockSize // XFS_AG_MAX_BLOCKS: 1 TiB
	defaultAGs  = 4                       // mkfs.xfs's count for a single disk
	logMin      = 64 << 20 / BlockSize    // XFS_MIN_LOG_BYTES: mkfs.xfs's default up to 128 GiB
	logMax      = 521728                  // mkfs.xfs's largest default (about 2 GiB)
	logRatio    = 2048                    // mkfs.xfs: a log of 1/2048 of the blocks above that
	tib         = 1 << 40 / BlockSize     // a TiB in blocks
)

// ErrSize says a size is out of the range this formatter makes.
var ErrSize = errors.New("size out of range")

// geometry is the layout of one file system.
type geometry struct {
	blocks    uint64 // sb_dblocks
	agCount   uint32
	agBlocks  uint32 // all groups but the last
	agBlkLog  uint8  // bits of an AG-relative block number
	logAG     uint32 // the group holding the internal log
	logBlocks uint32
	imaxPct   uint8
}

// newGeometry lays out a file system of size bytes: four groups (more of
// 1 TiB each past 4 TiB), a tail too short for a group of its own left
// out, the log in the middle group, as mkfs.xfs does.
func newGeometry(size int64) (*geometry, error) {
	if size < MinSize || size > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes (this formatter makes %d bytes to %d)", ErrSize, size, int64(MinSize), int64(MaxSize))
	}
	g := &geometry{blocks: uint64(size) / BlockSize, agCount: defaultAGs}
	ag := (g.blocks + defaultAGs - 1) / defaultAGs
	if ag > maxAGBlocks {
		ag = maxAGBlocks
		g.agCount = uint32((g.blocks + ag - 1) / ag)
	}
	g.agBlocks = uint32(ag)
	if tail := g.blocks - uint64(g.agCount-1)*ag; tail < mkfsAGMin {
		g.agCount--
		g.blocks -= tail
	}
	g.agBlkLog = uint8(bits.Len32(g.agBlocks - 1))
	g.logBlocks = uint32(min(max(g.blocks/logRatio, logMin), logMax))
	g.logAG = g.agCount / 2
	switch {
	case g.blocks < tib:
		g.imaxPct = 25
	case g.blocks < 50*tib:
		g.imaxPct = 5
	default:
		g.imaxPct = 1
	}
	return g, nil
}

// agLen is group a's length in blocks: the last one takes the rest.
func (g *geometry) agLen(a uint32) uint32 {
	if a == g.agCount-1 {
		return uint32(g.blocks - uint64(a)*uint64(g.agBlocks))
	}
	return g.agBlocks
}

// extent is a run of blocks in one group.
type extent struct{ start, len uint32 }

// agLayout is what group a holds past its headers and btree roots: the
// log (in the log group), the AGFL's blocks, the first inode chunk (in
// group 0, aligned as xfs_repair expects the root inode), and the free
// extents left, by block.
type agLayout struct {
	log   extent // len 0 but in the log group
	agfl  extent
	chunk extent // len 0 but in group 0
	free  []extent
}

func (g *geometry) layout(a uint32) agLayout {
	var l agLayout
	next := uint32(firstFree)
	if a == g.logAG {
		l.log = extent{next, g.logBlocks}
		next += g.logBlocks
	}
	l.agfl = extent{next, agflFill}
	next += agflFill
	if a == 0 {
		c := (next + inoAlign - 1) / inoAlign * inoAlign
		if c > next {
			l.free = append(l.free, extent{next, c - next})
		}
		l.chunk = extent{c, chunkBlks}
		next = c + chunkBlks
	}
	l.free = append(l.free, extent{next, g.agLen(a) - next})
	return l
}

// rootIno is the root directory's inode number: the first of group 0's
// chunk (AG 0, so the AG-relative number is the inode number).
func (g *geometry) rootIno() uint64 { return uint64(g.layout(0).chunk.start) * inopblock }

// fsb is the file system block number of group a's block b
// (XFS_AGB_TO_FSB: the group in the high bits).
func (g *geometry) fsb(a, b uint32) uint64 { return uint64(a)<<g.agBlkLog | uint64(b) }

// daddr is the 512-byte disk address of group a's block b (bb_blkno).
func (g *geometry) daddr(a, b uint32) uint64 {
	return (uint64(a)*uint64(g.agBlocks) + uint64(b)) * (BlockSize / 512)
}

// GrowTarget is the size in blocks XFS_IOC_FSGROWFSDATA makes of a file
// system of groups of agBlocks blocks on a device of devBlocks: the
// kernel leaves out a tail too short for a group (xfs_growfs_data_private),
// so a caller compares with this, not with the device, to tell whether
// there is anything to grow.
func GrowTarget(agBlocks uint32, devBlocks uint64) uint64 {
	if agBlocks == 0 {
		return devBlocks
	}
	if mod := devBlocks % uint64(agBlocks); mod != 0 && mod < minAGBlocks {
		return devBlocks - mod
	}
	return devBlocks
}
