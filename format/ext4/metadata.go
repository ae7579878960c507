package ext4

import (
	"encoding/binary"
)

var le = binary.LittleEndian

// superblock is the superblock copy for group g (1024 bytes).
func (w *writer) superblock(g uint32, freeInodes uint64) []byte {
	geo, now := w.geo, uint32(w.opt.Now.Unix())
	sb := make([]byte, 1024)
	le.PutUint32(sb[0x00:], geo.inodesPer*geo.groups) // s_inodes_count
	le.PutUint32(sb[0x04:], uint32(geo.blocks))       // s_blocks_count_lo
	// s_r_blocks_count_lo (0x08) stays 0: a volume's whole capacity is
	// its pod's; no blocks are held back for root.
	le.PutUint32(sb[0x0C:], uint32(w.freeBlocks))
	le.PutUint32(sb[0x10:], uint32(freeInodes))
	le.PutUint32(sb[0x14:], 0)              // s_first_data_block: 0 with 4 KiB blocks
	le.PutUint32(sb[0x18:], 2)              // s_log_block_size: 1024 << 2
	le.PutUint32(sb[0x1C:], 2)              // s_log_cluster_size
	le.PutUint32(sb[0x20:], blocksPerGroup) // s_blocks_per_group
	le.PutUint32(sb[0x24:], blocksPerGroup) // s_clusters_per_group
	le.PutUint32(sb[0x28:], geo.inodesPer)
	le.PutUint32(sb[0x30:], now)    // s_wtime
	le.PutUint16(sb[0x36:], 0xFFFF) // s_max_mnt_count: -1, no forced checks
	le.PutUint16(sb[0x38:], 0xEF53) // s_magic
	le.PutUint16(sb[0x3A:], 1)      // s_state: clean
	le.PutUint16(sb[0x3C:], 1)      // s_errors: continue
	le.PutUint32(sb[0x40:], now)    // s_lastcheck
	le.PutUint32(sb[0x4C:], 1)      // s_rev_level: dynamic
	le.PutUint32(sb[0x54:], firstInode)
	le.PutUint16(sb[0x58:], inodeSize)
	le.PutUint16(sb[0x5A:], uint16(g)) // s_block_group_nr
	le.PutUint32(sb[0x5C:], compatHasJournal|compatExtAttr|compatDirIndex)
	le.PutUint32(sb[0x60:], incompatFiletype|incompatExtents)
	le.PutUint32(sb[0x64:], roCompatSparseSuper|roCompatLargeFile|roCompatHugeFile|roCompatDirNlink|roCompatExtraIsize)
	copy(sb[0x68:0x78], w.opt.UUID[:])
	copy(sb[0x78:0x88], w.opt.Label)
	le.PutUint32(sb[0xE0:], journalInode) // s_journal_inum
	// s_hash_seed: a UUID of its own, derived from the volume's, so
	// directory hashes differ between file systems.
	seed := w.opt.UUID
	for i := range seed {
		seed[i] ^= 0x5a
	}
	copy(sb[0xEC:0xFC], seed[:])
	sb[0xFC] = 1                     // s_def_hash_version: half_md4
	sb[0xFD] = 1                     // s_jnl_backup_type: EXT3_JNL_BACKUP_BLOCKS
	le.PutUint32(sb[0x100:], 0x000C) // s_default_mount_opts: user_xattr, acl
	le.PutUint32(sb[0x108:], now)    // s_mkfs_time
	copy(sb[0x10C:0x150], w.journalInodeBlocks())
	le.PutUint16(sb[0x15C:], 32) // s_min_extra_isize
	le.PutUint16(sb[0x15E:], 32) // s_want_extra_isize
	le.PutUint32(sb[0x160:], 1)  // s_flags: signed directory hash (x86's char)
	return sb
}

// journalInodeBlocks is s_jnl_blocks: the journal inode's i_block, then
// its size's high and low words.
func (w *writer) journalInodeBlocks() []byte {
	b := make([]byte, 17*4)
	copy(b, w.journalIBlock())
	size := uint64(w.geo.journalBlocks) * blockSize
	le.PutUint32(b[15*4:], uint32(size>>32))
	le.PutUint32(b[16*4:], uint32(size))
	return b
}

// extentHeader writes an ext4_extent_header.
func extentHeader(b []byte, entries, maxEntries, depth uint16) {
	le.PutUint16(b[0:], 0xF30A)
	le.PutUint16(b[2:], entries)
	le.PutUint16(b[4:], maxEntries)
	le.PutUint16(b[6:], depth)
}

// extent writes an ext4_extent: logical block, length, physical start.
func extent(b []byte, logical uint32, r run) {
	le.PutUint32(b[0:], logical)
	le.PutUint16(b[4:], uint16(r.len))
	le.PutUint16(b[6:], uint16(r.start>>32))
	le.PutUint32(b[8:], uint32(r.start))
}

// extentsIBlock is an inode's i_block mapping runs in logical order (at
// most four).
func extentsIBlock(runs []run) []byte {
	b := make([]byte, 60)
	extentHeader(b, uint16(len(runs)), 4, 0)
	logical := uint32(0)
	for i, r := range runs {
		extent(b[12+12*i:], logical, r)
		logical += r.len
	}
	return b
}

// journalIBlock is the journal inode's i_block: its extents, or one index
// entry pointing at the leaf block that holds them.
func (w *writer) journalIBlock() []byte {
	geo := w.geo
	if geo.leaf == 0 {
		return extentsIBlock(geo.journal)
	}
	b := make([]byte, 60)
	extentHeader(b, 1, 4, 1)
	le.PutUint32(b[12:], 0) // ei_block
	le.PutUint32(b[16:], uint32(geo.leaf))
	le.PutUint16(b[20:], uint16(geo.leaf>>32))
	return b
}

// inode encodes one inode of the given mode, size, links and i_block.
func (w *writer) inode(mode uint16, size uint64, links uint16, blocks512 uint64, iblock []byte) []byte {
	now := uint32(w.opt.Now.Unix())
	b := make([]byte, inodeSize)
	le.PutUint16(b[0x00:], mode)
	le.PutUint32(b[0x04:], uint32(size))
	le.PutUint32(b[0x08:], now) // atime
	le.PutUint32(b[0x0C:], now) // ctime
	le.PutUint32(b[0x10:], now) // mtime
	le.PutUint16(b[0x1A:], links)
	le.PutUint32(b[0x1C:], uint32(blocks512))
	le.PutUint32(b[0x20:], extentsFlag)
	copy(b[0x28:0x64], iblock)
	le.PutUint32(b[0x6C:], uint32(size>>32))
	le.PutUint16(b[0x74:], uint16(blocks512>>32))
	le.PutUint16(b[0x80:], 32)  // i_extra_isize
	le.PutUint32(b[0x90:], now) // i_crtime
	return b
}

// writeInodes writes the root directory's, lost+found's and the
// journal's inodes into group 0's inode table.
func (w *writer) writeInodes() error {
	geo := w.geo
	table := make([]byte, blockSize) // inodes 1-16
	put := func(ino uint32, b []byte) { copy(table[(ino-1)*inodeSize:], b) }
	put(rootInode, w.inode(0o040000|uint16(w.opt.RootMode), blockSize, 3, blockSize/512, extentsIBlock([]run{{geo.rootBlock, 1}})))
	put(lostFoundInode, w.inode(0o040700, lostFoundSize*blockSize, 2, lostFoundSize*blockSize/512,
		extentsIBlock([]run{{geo.lostFound, lostFoundSize}})))
	jblocks := uint64(geo.journalBlocks)
	if geo.leaf != 0 {
		jblocks++
	}
	put(journalInode, w.inode(0o100600, uint64(geo.journalBlocks)*blockSize, 1, jblocks*blockSize/512, w.journalIBlock()))
	return w.at(geo.inodeTable(0), table)
}

// dirent writes an ext4_dir_entry_2 and returns its length.
func dirent(b []byte, ino uint32, recLen uint16, name string) {
	le.PutUint32(b[0:], ino)
	le.PutUint16(b[4:], recLen)
	b[6] = byte(len(name))
	if ino != 0 {
		b[7] = 2 // EXT4_FT_DIR: every entry made here is a directory
	}
	copy(b[8:], name)
}

// writeDirs writes the root directory's block and lost+found's.
func (w *writer) writeDirs() error {
	geo := w.geo
	root := make([]byte, blockSize)
	dirent(root[0:], rootInode, 12, ".")
	dirent(root[12:], rootInode, 12, "..")
	dirent(root[24:], lostFoundInode, blockSize-24, "lost+found")
	if err := w.at(geo.rootBlock, root); err != nil {
		return err
	}
	lf := make([]byte, lostFoundSize*blockSize)
	dirent(lf[0:], lostFoundInode, 12, ".")
	dirent(lf[12:], rootInode, blockSize-12, "..")
	for i := 1; i < lostFoundSize; i++ {
		dirent(lf[i*blockSize:], 0, blockSize, "")
	}
	return w.at(geo.lostFound, lf)
}

// writeJournal writes the journal's superblock (jbd2, big-endian) at its
// first block, and the extent leaf when the journal has one. The rest of
// the journal stays zeros: with s_start 0 the journal is empty, and the
// kernel writes every block before it reads it back.
func (w *writer) writeJournal() error {
	geo := w.geo
	be := binary.BigEndian
	jsb := make([]byte, blockSize)
	be.PutUint32(jsb[0:], 0xC03B3998)         // h_magic
	be.PutUint32(jsb[4:], 4)                  // h_blocktype: superblock v2
	be.PutUint32(jsb[12:], blockSize)         // s_blocksize
	be.PutUint32(jsb[16:], geo.journalBlocks) // s_maxlen
	be.PutUint32(jsb[20:], 1)                 // s_first
	be.PutUint32(jsb[24:], 1)                 // s_sequence
	copy(jsb[48:64], w.opt.UUID[:])           // s_uuid
	be.PutUint32(jsb[64:], 1)                 // s_nr_users
	if err := w.at(geo.journal[0].start, jsb); err != nil {
		return err
	}
	if geo.leaf == 0 {
		return nil
	}
	leaf := make([]byte, blockSize)
	extentHeader(leaf, uint16(len(geo.journal)), (blockSize-12)/12, 0)
	logical := uint32(0)
	for i, r := range geo.journal {
		extent(leaf[12+12*i:], logical, r)
		logical += r.len
	}
	return w.at(geo.leaf, leaf)
}
