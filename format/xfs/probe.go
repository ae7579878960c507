package xfs

import (
	"errors"
	"fmt"
	"io"
)

// Size is what an XFS superblock says of the file system's extent.
type Size struct {
	Blocks    uint64 // sb_dblocks
	BlockSize uint32
	AGBlocks  uint32 // the groups' length, which GrowTarget needs
	// SectorSize is sb_sectsize: the smallest I/O the file system makes,
	// so the largest logical block its device may have.
	SectorSize uint32
}

// Bytes is the file system's length.
func (s Size) Bytes() int64 { return int64(s.Blocks) * int64(s.BlockSize) }

// ErrNotXFS says the primary superblock is not an XFS one.
var ErrNotXFS = errors.New("no XFS superblock")

// ReadSize reads the primary superblock of the XFS on r (an image file
// or a device): how far the file system reaches, so a caller can tell
// whether it is smaller than its device and needs growing.
func ReadSize(r io.ReaderAt) (Size, error) {
	sb := make([]byte, 512)
	if _, err := r.ReadAt(sb, 0); err != nil {
		return Size{}, fmt.Errorf("reading the superblock: %w", err)
	}
	if be.Uint32(sb[0:]) != sbMagic {
		return Size{}, ErrNotXFS
	}
	return Size{Blocks: be.Uint64(sb[8:]), BlockSize: be.Uint32(sb[4:]), AGBlocks: be.Uint32(sb[84:]), SectorSize: uint32(be.Uint16(sb[102:]))}, nil
}
