package ext4

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/format/internal/blank"
)

// Offline growth. The kernel grows a mounted ext4 (EXT4_IOC_RESIZE_FS)
// only for CAP_SYS_RESOURCE; a file system laid out as Format lays it out
// can also be grown while nothing has it mounted, by writing the new
// groups' metadata here, with no capability beyond opening the image.
//
// What Grow takes: exactly Format's layout (4 KiB blocks, groups of 32768
// blocks, no flex_bg, resize inode, meta_bg, 64bit or checksums), clean
// (no journal to replay, no recorded error), and a growth that needs no
// more descriptor blocks than it has, since adding one would move every
// group's bitmaps that follow a superblock copy: one descriptor block
// holds 128 groups (16 GiB), so a file system of N descriptor blocks grows
// offline up to N*16 GiB, and the rest is the kernel's. Anything else is
// ErrLayout or ErrNeedsRecovery, and is left to the kernel.
//
// The order of the writes is what makes a power cut safe. First what the
// file system does not reach yet: the new groups' bitmaps, their inode
// tables made zeros, their superblock and descriptor copies, and the new
// groups' entries in the primary descriptor table (past the entries the
// current superblock counts). Then the commit: one write of the primary
// superblock's first sector, where every count that changes lives (the
// 512 bytes a disk writes whole). Cut before it, the file system is the
// old one; after it, the new one. A last group that was short is widened
// after the commit: its bitmap's padding bits are cleared, then its
// descriptor's free count raised, then the superblock's counts. Those two
// blocks cannot be written as one, so the commit also marks the widening
// unfinished: the committed superblock's "last mounted on" field (which
// the kernel only rewrites when it first opens a file, and e2fsck never
// reads) names the group and its old end, and the last write clears it.
// A growth that finds the mark finishes the widening first (rolls
// forward), before anything else; every stage grows before it mounts, so
// a cut anywhere after the commit is finished before the kernel sees the
// file system. Unfinished, a cut right after the commit leaves those
// blocks counted used (space e2fsck gives back), and a cut between the
// two writes a group whose bitmap and descriptor disagree, which the
// kernel's first allocation there reports as an error ("clean with
// errors", ENOSPC with space free, every later growth refused); neither
// loses a byte. The old groups' superblock and descriptor copies, which
// only e2fsck reads, are brought up to date last.

// ErrLayout is wrapped by Grow's error for a file system it does not grow:
// not laid out as Format makes them. The kernel's online resize can.
var ErrLayout = errors.New("a layout this package does not grow offline")

// ErrNeedsRecovery is wrapped by Grow's error for a file system whose
// journal holds transactions not yet written in place: replaying them
// (a mount does) could overwrite what a growth writes, so mount and
// unmount it first.
var ErrNeedsRecovery = errors.New("the journal needs recovery")

// More feature and state bits (fs/ext4/ext4.h).
const (
	compatResizeInode = 0x0010
	incompatRecover   = 0x0004
	stateValid        = 0x0001 // EXT4_VALID_FS: unmounted cleanly
	stateErrors       = 0x0002 // EXT4_ERROR_FS: errors were found
)

// disk is what Grow reads and writes: an image file or a block device,
// or, in tests, one that loses every write past a power cut.
type disk interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	// zero makes n bytes at off read as zeros.
	zero(off, n int64) error
}

// fileDisk is an open image file or block device.
type fileDisk struct {
	*os.File
	regular bool
}

// zero punches a file's range to a hole. A device's range is read and
// written with zeros only where it is not zeros already: the new groups'
// inode tables lie where the file system never reached, which reads as
// zeros unless something wrote there, and BLKZEROOUT on a loop device
// would allocate its backing file's blocks.
func (d fileDisk) zero(off, n int64) error {
	if d.regular {
		if err := unix.Fallocate(int(d.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
			return &os.PathError{Op: "fallocate(PUNCH_HOLE)", Path: d.Name(), Err: err}
		}
		return nil
	}
	buf := make([]byte, 1<<20)
	zeros := make([]byte, len(buf))
	for done := int64(0); done < n; {
		chunk := buf[:min(int64(len(buf)), n-done)]
		if _, err := d.ReadAt(chunk, off+done); err != nil {
			return fmt.Errorf("reading %s at %d: %w", d.Name(), off+done, err)
		}
		if !bytes.Equal(chunk, zeros[:len(chunk)]) {
			if _, err := d.WriteAt(zeros[:len(chunk)], off+done); err != nil {
				return fmt.Errorf("zeroing %s at %d: %w", d.Name(), off+done, err)
			}
		}
		done += int64(len(chunk))
	}
	return nil
}

// Grow grows the ext4 file system in f to as many blocks as f's size holds
// (what Blocks says of a file system Format would make there, give or take
// a short last group), or as far as its descriptor blocks map (16 GiB for
// each; GrowTarget says ErrSize past it, where the kernel can go on),
// offline: f is an image file or a block device
// opened read-write, and nothing may have the file system mounted (open a
// device with O_EXCL, which the kernel refuses while it is mounted). It
// returns the file system's size after, which is the size before when
// there is nothing to add. The first paragraph of this file says what it
// grows and what a power cut leaves.
func Grow(f *os.File) (Size, error) {
	size, regular, err := blank.Size(f)
	if err != nil {
		return Size{}, err
	}
	return grow(fileDisk{File: f, regular: regular}, size)
}

// groups is how many groups a file system of that many blocks has.
func groupsOf(blocks uint64) uint32 {
	return uint32((blocks + blocksPerGroup - 1) / blocksPerGroup)
}

// GrowTarget is how many blocks Grow would make of the file system on r
// in size bytes (its current count where it would add nothing), whether
// or not it is mounted now (a mounted ext4 has a journal to replay, which
// Grow refuses): the size the file system can reach without a descriptor
// block more. Its error is Grow's for a layout Grow does not take.
func GrowTarget(r io.ReaderAt, size int64) (uint64, error) {
	sb := make([]byte, 1024)
	if _, err := r.ReadAt(sb, superblockOffset); err != nil {
		return 0, fmt.Errorf("reading the superblock: %w", err)
	}
	old, err := growable(sb, false)
	if err != nil {
		return 0, err
	}
	geo, err := old.grownTo(size, false)
	if err != nil {
		return 0, err
	}
	return geo.blocks, nil
}

// growable checks that the superblock sb is of a file system laid out as
// Format makes them, clean if asked, and returns its geometry's fixed
// part.
func growable(sb []byte, clean bool) (*geometry, error) {
	if le.Uint16(sb[0x38:]) != superMagic {
		return nil, ErrNotExt4
	}
	compat, incompat, roCompat := le.Uint32(sb[0x5C:]), le.Uint32(sb[0x60:]), le.Uint32(sb[0x64:])
	if incompat&incompatRecover != 0 {
		if clean {
			return nil, ErrNeedsRecovery
		}
		incompat &^= incompatRecover
	}
	const (
		compatOK   = compatHasJournal | compatExtAttr | compatDirIndex
		incompatOK = incompatFiletype | incompatExtents
		roCompatOK = roCompatSparseSuper | roCompatLargeFile | roCompatHugeFile | roCompatDirNlink | roCompatExtraIsize
	)
	ipg, isz := le.Uint32(sb[0x28:]), uint32(le.Uint16(sb[0x58:]))
	switch {
	case compat&^compatOK != 0:
		return nil, fmt.Errorf("%w: compatible features %#x (this package makes %#x)", ErrLayout, compat, uint32(compatOK))
	case incompat&^incompatOK != 0:
		return nil, fmt.Errorf("%w: incompatible features %#x (this package makes %#x)", ErrLayout, incompat, uint32(incompatOK))
	case roCompat&^roCompatOK != 0 || roCompat&roCompatSparseSuper == 0:
		return nil, fmt.Errorf("%w: read-only compatible features %#x (this package makes %#x)", ErrLayout, roCompat, uint32(roCompatOK))
	case le.Uint32(sb[0x14:]) != 0 || le.Uint32(sb[0x18:]) != 2 || le.Uint32(sb[0x1C:]) != 2:
		return nil, fmt.Errorf("%w: blocks of 1024<<%d bytes from block %d", ErrLayout, le.Uint32(sb[0x18:]), le.Uint32(sb[0x14:]))
	case le.Uint32(sb[0x20:]) != blocksPerGroup || le.Uint32(sb[0x24:]) != blocksPerGroup:
		return nil, fmt.Errorf("%w: %d blocks per group", ErrLayout, le.Uint32(sb[0x20:]))
	case le.Uint16(sb[0xCE:]) != 0:
		return nil, fmt.Errorf("%w: %d reserved descriptor blocks", ErrLayout, le.Uint16(sb[0xCE:]))
	case ipg == 0 || ipg > blocksPerGroup || isz == 0 || ipg*isz%blockSize != 0:
		return nil, fmt.Errorf("%w: %d inodes of %d bytes per group", ErrLayout, ipg, isz)
	}
	if state := le.Uint16(sb[0x3A:]); clean && (state&stateValid == 0 || state&stateErrors != 0) {
		return nil, fmt.Errorf("%w: the file system is not clean (state %#x): e2fsck it first", ErrLayout, state)
	}
	blocks := uint64(le.Uint32(sb[0x04:]))
	groups := groupsOf(blocks)
	return &geometry{
		blocks:       blocks,
		groups:       groups,
		inodesPer:    ipg,
		itableBlocks: ipg * isz / blockSize,
		gdtBlocks:    (groups*descSize + blockSize - 1) / blockSize,
	}, nil
}

// grownTo is the geometry of the file system geo grown to size bytes:
// its groups' metadata as it has them, and as many whole groups, and a
// short last one, as fit. Past what its descriptor blocks map, it is
// ErrSize, or, when clamp is set, as far as they map. A size that adds
// nothing gives geo back.
func (geo *geometry) grownTo(size int64, clamp bool) (*geometry, error) {
	if size < 0 || uint64(size)/blockSize > 1<<32-1 {
		return nil, fmt.Errorf("%w: %d bytes is past the %d a file system without the 64bit feature holds", ErrSize, size, int64(MaxSize))
	}
	g := *geo
	g.blocks = uint64(size) / blockSize
	g.groups = groupsOf(g.blocks)
	if most := geo.gdtBlocks * (blockSize / descSize); g.groups > most {
		if !clamp {
			return nil, fmt.Errorf("%w offline: %d bytes would need more than the %d descriptor blocks this file system has, which map at most %d bytes", ErrSize, size, geo.gdtBlocks, int64(most)*blocksPerGroup*blockSize)
		}
		g.blocks, g.groups = uint64(most)*blocksPerGroup, most
	}
	// A new last group too short for its metadata and some data is left
	// out, as Format leaves it out.
	if last := g.groups - 1; last >= geo.groups && g.groupBlocks(last) < g.overhead(last)+50 {
		g.blocks, g.groups = groupStart(last), last
	}
	if g.blocks <= geo.blocks {
		return geo, nil
	}
	return &g, nil
}

// lastMounted is where the superblock keeps the path it was last
// mounted on (s_last_mounted, 64 bytes), and wideningMark the format of
// what a growth's commit puts there until its last write.
const (
	lastMounted  = 0x88
	wideningMark = "hostpath-csi growth: group %d from block %d"
)

// widening is the mark a committed superblock sb carries of a short last
// group widened after the commit: the group and its old width.
func widening(sb []byte) (group, from uint32, ok bool) {
	field := sb[lastMounted : lastMounted+64]
	if i := bytes.IndexByte(field, 0); i >= 0 {
		field = field[:i]
	}
	n, err := fmt.Sscanf(string(field), wideningMark, &group, &from)
	return group, from, err == nil && n == 2
}

// markWidening returns sb marked as widening group from its old width.
func markWidening(sb []byte, group, from uint32) []byte {
	out := bytes.Clone(sb)
	field := out[lastMounted : lastMounted+64]
	clear(field)
	copy(field, fmt.Sprintf(wideningMark, group, from))
	return out
}

// finishWidening finishes the widening of a short last group that a
// power cut left after the commit (the package comment says how the mark
// finds it), and returns the superblock as it is after. The group's bits
// past its old width are cleared only if every one is still set (the
// bitmap not written yet: nothing can have been allocated there); its
// descriptor's free count is then made what its bitmap says. Anything
// else a bitmap and descriptor disagree on is not this package's doing,
// and is left to e2fsck (ErrLayout).
func finishWidening(d disk, sb []byte, geo *geometry) ([]byte, error) {
	tail, from, ok := widening(sb)
	if !ok {
		return sb, nil
	}
	if tail >= geo.groups || from > geo.groupBlocks(tail) {
		return nil, fmt.Errorf("%w: the superblock marks group %d widened from block %d, which this file system of %d groups does not have", ErrLayout, tail, from, geo.groups)
	}
	gdt := make([]byte, int(geo.gdtBlocks)*blockSize)
	if _, err := d.ReadAt(gdt, blockSize); err != nil {
		return nil, fmt.Errorf("reading the group descriptors: %w", err)
	}
	desc := gdt[tail*descSize : (tail+1)*descSize]
	at := int64(le.Uint32(desc[0:])) * blockSize
	bitmap := make([]byte, blockSize)
	if _, err := d.ReadAt(bitmap, at); err != nil {
		return nil, fmt.Errorf("reading group %d's block bitmap: %w", tail, err)
	}
	end := geo.groupBlocks(tail)
	set := func(i uint32) bool { return bitmap[i/8]&(1<<(i%8)) != 0 }
	padded := true
	for i := from; i < end; i++ {
		padded = padded && set(i)
	}
	if padded {
		for i := from; i < end; i++ {
			bitmap[i/8] &^= 1 << (i % 8)
		}
		if err := writeAt(d, at, bitmap); err != nil {
			return nil, err
		}
		if err := sync(d); err != nil {
			return nil, err
		}
	}
	free := uint16(0)
	for i := uint32(0); i < end; i++ {
		if !set(i) {
			free++
		}
	}
	switch have := le.Uint16(desc[12:]); {
	case have > free:
		return nil, fmt.Errorf("%w: group %d's descriptor counts %d blocks free and its bitmap %d: e2fsck it", ErrLayout, tail, have, free)
	case have < free:
		le.PutUint16(desc[12:], free)
		if err := writeAt(d, blockSize, gdt); err != nil {
			return nil, err
		}
		if err := sync(d); err != nil {
			return nil, err
		}
	}
	final := counted(sb, gdt, geo)
	clear(final[lastMounted : lastMounted+64])
	if err := writeAt(d, superblockOffset, final[:512]); err != nil {
		return nil, err
	}
	if err := copies(d, final, gdt, 1, geo.groups); err != nil {
		return nil, err
	}
	return final, sync(d)
}

// copies writes superblock sb and descriptors gdt as the copies of
// groups [from, to) that hold one (never group 0's: the primary).
func copies(d disk, sb, gdt []byte, from, to uint32) error {
	for g := max(from, 1); g < to; g++ {
		if !hasSuper(g) {
			continue
		}
		blk := make([]byte, blockSize)
		copy(blk, sb)
		le.PutUint16(blk[0x5A:], uint16(g)) // s_block_group_nr
		if err := writeBlock(d, groupStart(g), blk); err != nil {
			return err
		}
		if err := writeBlock(d, groupStart(g)+1, gdt); err != nil {
			return err
		}
	}
	return nil
}

// grow is Grow on d of size bytes.
func grow(d disk, size int64) (Size, error) {
	sb := make([]byte, 1024)
	if _, err := d.ReadAt(sb, superblockOffset); err != nil {
		return Size{}, fmt.Errorf("reading the superblock: %w", err)
	}
	old, err := growable(sb, true)
	if err != nil {
		return Size{}, err
	}
	// What a cut left of the last growth is finished first: a growth
	// with nothing to add must still finish it.
	if sb, err = finishWidening(d, sb, old); err != nil {
		return Size{}, err
	}
	before := Size{Blocks: old.blocks, BlockSize: blockSize}
	g, err := old.grownTo(size, true)
	if err != nil || g.blocks <= old.blocks {
		return before, err
	}
	geo := *g
	gdt := make([]byte, int(old.gdtBlocks)*blockSize)
	if _, err := d.ReadAt(gdt, blockSize); err != nil {
		return before, fmt.Errorf("reading the group descriptors: %w", err)
	}
	// The last group's bitmap, read before anything is written, so the
	// padding bits to clear are known.
	tail := old.groups - 1
	tailBitmap := make([]byte, blockSize)
	if _, err := d.ReadAt(tailBitmap, int64(le.Uint32(gdt[tail*descSize:]))*blockSize); err != nil {
		return before, fmt.Errorf("reading group %d's block bitmap: %w", tail, err)
	}

	// The new groups: bitmaps, zeroed inode tables, descriptors.
	w := &writer{geo: &geo}
	for g := old.groups; g < geo.groups; g++ {
		if err := d.zero(int64(geo.inodeTable(g))*blockSize, int64(geo.itableBlocks)*blockSize); err != nil {
			return before, err
		}
		if err := writeBlock(d, geo.blockBitmap(g), w.blockBitmap(g)); err != nil {
			return before, err
		}
		if err := writeBlock(d, geo.inodeBitmap(g), inodeBitmap(geo.inodesPer, 0)); err != nil {
			return before, err
		}
		desc := gdt[int(g)*descSize : int(g+1)*descSize]
		clear(desc)
		le.PutUint32(desc[0:], uint32(geo.blockBitmap(g)))
		le.PutUint32(desc[4:], uint32(geo.inodeBitmap(g)))
		le.PutUint32(desc[8:], uint32(geo.inodeTable(g)))
		le.PutUint16(desc[12:], uint16(geo.groupBlocks(g)-geo.overhead(g)))
		le.PutUint16(desc[14:], uint16(geo.inodesPer))
	}
	// The short last group's padding, from its old end to its new one.
	widened := tailBitmap
	added := uint32(0)
	if oldEnd, newEnd := old.groupBlocks(tail), geo.groupBlocks(tail); newEnd > oldEnd {
		widened = bytes.Clone(tailBitmap)
		for i := oldEnd; i < newEnd; i++ {
			if widened[i/8]&(1<<(i%8)) != 0 {
				widened[i/8] &^= 1 << (i % 8)
				added++
			}
		}
	}
	// The superblock as committed (the widened blocks still counted used,
	// and marked to be widened) and as it ends; the copies carry the end.
	committed := counted(sb, gdt, &geo)
	final, finalGDT := committed, gdt
	if added > 0 {
		finalGDT = bytes.Clone(gdt)
		desc := finalGDT[tail*descSize:]
		le.PutUint16(desc[12:], le.Uint16(desc[12:])+uint16(added))
		final = counted(sb, finalGDT, &geo)
		committed = markWidening(committed, tail, old.groupBlocks(tail))
	}
	if err := copies(d, final, finalGDT, old.groups, geo.groups); err != nil {
		return before, err
	}
	if err := writeBlock(d, 1, gdt); err != nil {
		return before, err
	}
	if err := sync(d); err != nil {
		return before, err
	}
	// The commit.
	if err := writeAt(d, superblockOffset, committed[:512]); err != nil {
		return before, err
	}
	if err := sync(d); err != nil {
		return before, err
	}
	after := Size{Blocks: geo.blocks, BlockSize: blockSize}
	if added > 0 {
		if err := writeBlock(d, uint64(le.Uint32(gdt[tail*descSize:])), widened); err != nil {
			return after, err
		}
		if err := sync(d); err != nil {
			return after, err
		}
		if err := writeBlock(d, 1, finalGDT); err != nil {
			return after, err
		}
		if err := writeAt(d, superblockOffset, final[:512]); err != nil {
			return after, err
		}
	}
	if err := copies(d, final, finalGDT, 1, old.groups); err != nil {
		return after, err
	}
	return after, sync(d)
}

// counted is superblock sb with geo's block and inode counts, and free
// counts summed from the descriptors in gdt (what the kernel sums at
// mount; the superblock's own are only brought up to date now and then).
func counted(sb, gdt []byte, geo *geometry) []byte {
	out := bytes.Clone(sb)
	var freeBlocks, freeInodes uint64
	for g := uint32(0); g < geo.groups; g++ {
		desc := gdt[g*descSize:]
		freeBlocks += uint64(le.Uint16(desc[12:]))
		freeInodes += uint64(le.Uint16(desc[14:]))
	}
	le.PutUint32(out[0x00:], geo.inodesPer*geo.groups)
	le.PutUint32(out[0x04:], uint32(geo.blocks))
	le.PutUint32(out[0x0C:], uint32(freeBlocks))
	le.PutUint32(out[0x10:], uint32(freeInodes))
	return out
}

func writeAt(d disk, off int64, p []byte) error {
	if _, err := d.WriteAt(p, off); err != nil {
		return fmt.Errorf("writing at %d: %w", off, err)
	}
	return nil
}

func writeBlock(d disk, block uint64, p []byte) error {
	return writeAt(d, int64(block)*blockSize, p)
}

func sync(d disk) error {
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing: %w", err)
	}
	return nil
}
