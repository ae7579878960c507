package ext4

import (
	"fmt"
	"io"
)

// Size is what an ext4 superblock says of the file system's extent.
type Size struct {
	Blocks    uint64 // s_blocks_count, hi half with the 64bit feature
	BlockSize uint32 // 1024 << s_log_block_size
}

// Bytes is the file system's length.
func (s Size) Bytes() int64 { return int64(s.Blocks) * int64(s.BlockSize) }

const (
	superblockOffset = 1024   // the primary superblock, after the boot sector's kilobyte
	superMagic       = 0xEF53 // s_magic
	incompat64bit    = 0x80   // INCOMPAT_64BIT: s_blocks_count has a high half
)

// ErrNotExt4 says the primary superblock is not an ext2/3/4 one.
var ErrNotExt4 = fmt.Errorf("no ext4 superblock")

// ReadSize reads the primary superblock of the file system on r (an image
// file or a device): how far the file system reaches, so a caller can tell
// whether it is smaller than its device and needs growing (after a restore
// into a larger volume, or an expansion while it was not mounted).
func ReadSize(r io.ReaderAt) (Size, error) {
	sb := make([]byte, 1024)
	if _, err := r.ReadAt(sb, superblockOffset); err != nil {
		return Size{}, fmt.Errorf("reading the superblock: %w", err)
	}
	if le.Uint16(sb[0x38:]) != superMagic {
		return Size{}, ErrNotExt4
	}
	s := Size{Blocks: uint64(le.Uint32(sb[0x04:])), BlockSize: 1024 << le.Uint32(sb[0x18:])}
	if le.Uint32(sb[0x60:])&incompat64bit != 0 {
		s.Blocks |= uint64(le.Uint32(sb[0x150:])) << 32
	}
	return s, nil
}
