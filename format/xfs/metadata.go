package xfs

import (
	"math/bits"
	"time"
)

// superblock is the superblock every group starts with (xfs_dsb). The
// copies in groups past the first are the primary's: the kernel reads
// only the primary, xfs_repair compares the copies' geometry with it.
func (w *writer) superblock() []byte {
	geo, sb := w.geo, sector()
	root := geo.rootIno()
	be.PutUint32(sb[0:], sbMagic)
	be.PutUint32(sb[4:], BlockSize)
	be.PutUint64(sb[8:], geo.blocks)
	// sb_rblocks, sb_rextents (16, 24): no realtime device.
	copy(sb[32:48], w.opt.UUID[:])
	be.PutUint64(sb[48:], geo.fsb(geo.logAG, geo.layout(geo.logAG).log.start))
	be.PutUint64(sb[56:], root)
	be.PutUint64(sb[64:], root+1) // the realtime bitmap inode
	be.PutUint64(sb[72:], root+2) // the realtime summary inode
	be.PutUint32(sb[80:], 1)      // sb_rextsize
	be.PutUint32(sb[84:], geo.agBlocks)
	be.PutUint32(sb[88:], geo.agCount)
	// sb_rbmblocks (92): 0.
	be.PutUint32(sb[96:], geo.logBlocks)
	be.PutUint16(sb[100:], versionNum)
	be.PutUint16(sb[102:], SectorSize)
	be.PutUint16(sb[104:], inodeSize)
	be.PutUint16(sb[106:], inopblock)
	// sb_fname (108..119): no label.
	sb[120] = log2(BlockSize)
	sb[121] = log2(SectorSize)
	sb[122] = log2(inodeSize)
	sb[123] = log2(inopblock)
	sb[124] = geo.agBlkLog
	// sb_rextslog (125), sb_inprogress (126): 0.
	sb[127] = geo.imaxPct
	be.PutUint64(sb[128:], chunkInos)   // sb_icount
	be.PutUint64(sb[136:], chunkInos-3) // sb_ifree: all but root, rbm, rsum
	be.PutUint64(sb[144:], w.free)
	// sb_frextents, quota inodes and flags, sb_flags, sb_shared_vn
	// (152..179): 0.
	be.PutUint32(sb[180:], inoAlign)
	// sb_unit, sb_width (184, 188), sb_dirblklog (192): 0.
	sb[193] = log2(SectorSize) // sb_logsectlog
	be.PutUint16(sb[194:], SectorSize)
	be.PutUint32(sb[196:], SectorSize) // sb_logsunit
	be.PutUint32(sb[200:], features2)
	be.PutUint32(sb[204:], features2) // sb_bad_features2 mirrors it
	// sb_features_compat, _ro_compat (208, 212): 0.
	be.PutUint32(sb[216:], incompat)
	// sb_features_log_incompat (220): 0; sb_crc at 224; sb_spino_align,
	// sb_pquotino, sb_lsn, sb_meta_uuid (228..263): 0.
	return sealed(sb[:SectorSize], 224)
}

// agf is group a's free-space header.
func (w *writer) agf(a uint32, freeBlks, longest uint32) []byte {
	p := sector()
	be.PutUint32(p[0:], agfMagic)
	be.PutUint32(p[4:], 1) // XFS_AGF_VERSION
	be.PutUint32(p[8:], a)
	be.PutUint32(p[12:], w.geo.agLen(a))
	be.PutUint32(p[16:], bnoRoot)
	be.PutUint32(p[20:], cntRoot)
	be.PutUint32(p[28:], 1) // bno btree levels
	be.PutUint32(p[32:], 1) // cnt btree levels
	// The AGFL's slots 1 to 4, as mkfs.xfs leaves them.
	be.PutUint32(p[40:], 1)
	be.PutUint32(p[44:], agflFill)
	be.PutUint32(p[48:], agflFill)
	be.PutUint32(p[52:], freeBlks)
	be.PutUint32(p[56:], longest)
	copy(p[64:80], w.opt.UUID[:])
	return sealed(p, 216)
}

// agi is group a's inode header; group 0 holds the one inode chunk.
func (w *writer) agi(a uint32, l agLayout) []byte {
	p := sector()
	be.PutUint32(p[0:], agiMagic)
	be.PutUint32(p[4:], 1) // XFS_AGI_VERSION
	be.PutUint32(p[8:], a)
	be.PutUint32(p[12:], w.geo.agLen(a))
	newino := uint32(nullAG)
	if l.chunk.len != 0 {
		be.PutUint32(p[16:], chunkInos)
		be.PutUint32(p[28:], chunkInos-3)
		newino = l.chunk.start * inopblock
	}
	be.PutUint32(p[20:], inoRoot)
	be.PutUint32(p[24:], 1) // inode btree levels
	be.PutUint32(p[32:], newino)
	be.PutUint32(p[36:], nullAG) // agi_dirino
	for i := 0; i < 64; i++ {
		be.PutUint32(p[40+4*i:], nullAG) // no unlinked inodes
	}
	copy(p[296:312], w.opt.UUID[:])
	return sealed(p, 312)
}

// agfl is group a's free list: its four blocks in slots 1 to 4.
func (w *writer) agfl(a uint32, l agLayout) []byte {
	p := sector()
	be.PutUint32(p[0:], agflMagic)
	be.PutUint32(p[4:], a)
	copy(p[8:24], w.opt.UUID[:])
	for i := 36; i < len(p); i += 4 {
		be.PutUint32(p[i:], nullAG)
	}
	for i := uint32(0); i < agflFill; i++ {
		be.PutUint32(p[36+4*(1+i):], l.agfl.start+i)
	}
	return sealed(p, 32)
}

// btreeBlock is a v5 short-form btree leaf at group a's block b.
func (w *writer) btreeBlock(a, b uint32, magic uint32, recs int) []byte {
	p := make([]byte, BlockSize)
	be.PutUint32(p[0:], magic)
	// bb_level (4): a leaf.
	be.PutUint16(p[6:], uint16(recs))
	be.PutUint32(p[8:], nullAG)  // bb_leftsib
	be.PutUint32(p[12:], nullAG) // bb_rightsib
	be.PutUint64(p[16:], w.geo.daddr(a, b))
	// bb_lsn (24): 0.
	copy(p[32:48], w.opt.UUID[:])
	be.PutUint32(p[48:], a) // bb_owner
	return p
}

// freeBtree is a free-space btree root holding exts in its key order.
func (w *writer) freeBtree(a, b, magic uint32, exts []extent) []byte {
	p := w.btreeBlock(a, b, magic, len(exts))
	for i, e := range exts {
		be.PutUint32(p[btreeHdr+8*i:], e.start)
		be.PutUint32(p[btreeHdr+8*i+4:], e.len)
	}
	return sealed(p, btreeCRC)
}

// inoBtree is the inode btree root: group 0's chunk, its first three
// inodes in use.
func (w *writer) inoBtree(a uint32, l agLayout) []byte {
	if l.chunk.len == 0 {
		return sealed(w.btreeBlock(a, inoRoot, inoMagic, 0), btreeCRC)
	}
	p := w.btreeBlock(a, inoRoot, inoMagic, 1)
	be.PutUint32(p[btreeHdr:], l.chunk.start*inopblock)
	be.PutUint32(p[btreeHdr+4:], chunkInos-3) // ir_freecount
	be.PutUint64(p[btreeHdr+8:], 1<<64-1-7)   // ir_free: all but the first three
	return sealed(p, btreeCRC)
}

// inodes is the first chunk: the root directory, the realtime bitmap and
// summary inodes (empty: there is no realtime device), and 61 free
// inodes, each with its number, the UUID and its CRC, as xfs_ialloc
// initializes a chunk.
func (w *writer) inodes(c extent) []byte {
	buf := make([]byte, int(c.len)*BlockSize)
	first := uint64(c.start) * inopblock
	for i := 0; i < chunkInos; i++ {
		p := buf[i*inodeSize : (i+1)*inodeSize]
		be.PutUint16(p[0:], dinMagic)
		p[4] = 3                     // di_version
		be.PutUint32(p[96:], nullAG) // di_next_unlinked
		be.PutUint64(p[152:], first+uint64(i))
		copy(p[160:176], w.opt.UUID[:])
		switch i {
		case 0: // the root directory: an empty short-form directory
			w.inodeCore(p, 0o40000|uint16(w.opt.RootMode), fmtLocal, 2, 0)
			be.PutUint64(p[56:], 6) // di_size: the header alone
			// count 0, i8count 0, then the parent: itself.
			be.PutUint32(p[176+2:], uint32(first))
		case 1:
			w.inodeCore(p, 0o100000, fmtExtent, 1, newRTBM)
		case 2:
			w.inodeCore(p, 0o100000, fmtExtent, 1, 0)
		}
		sealed(p, 100)
	}
	return buf
}

// inodeCore fills an inode in use: mode, data fork format, links, flags,
// and its times, now, in the bigtime encoding.
func (w *writer) inodeCore(p []byte, mode uint16, format uint8, nlink uint32, flags uint16) {
	be.PutUint16(p[2:], mode)
	p[5] = format
	be.PutUint32(p[16:], nlink)
	t := bigtimeOf(w.opt.Now)
	for _, off := range []int{32, 40, 48, 144} { // atime, mtime, ctime, crtime
		be.PutUint64(p[off:], t)
	}
	p[83] = fmtExtent // di_aformat: no attribute fork, extents
	be.PutUint16(p[90:], flags)
	be.PutUint64(p[104:], 1) // di_changecount
	be.PutUint64(p[120:], bigtime)
}

// bigtimeOf is t in XFS's bigtime encoding: nanoseconds since 1901-12-13
// (the Unix epoch less 2^31 seconds).
func bigtimeOf(t time.Time) uint64 {
	return uint64(t.Unix()+1<<31)*1e9 + uint64(t.Nanosecond())
}

func log2(n int) uint8 { return uint8(bits.Len(uint(n)) - 1) }

// Log record constants (the kernel's fs/xfs/libxfs/xfs_log_format.h).
const (
	logMagic      = 0xfeedbabe // XLOG_HEADER_MAGIC_NUM
	logVersion    = 2          // XLOG_VERSION_2
	logFmtLinux   = 1          // XLOG_FMT_LINUX_LE
	logBufSize    = 32 << 10   // h_size: the log buffer size mkfs.xfs records
	unmountTID    = 0xb0c0d0d0 // the unmount record's transaction id
	logClientLog  = 0xaa       // XFS_LOG
	logUnmount    = 0x20       // XLOG_UNMOUNT_TRANS
	unmountType   = 0x556e     // XLOG_UNMOUNT_TYPE, in the CPU's (little-endian) order
	basicBlock    = 512        // BBSIZE
	logFirstCycle = 1          // XLOG_INIT_CYCLE
)

// logHead is the log's first block: one record holding an unmount record
// at cycle 1, as mkfs.xfs leaves a new log (libxfs_log_clear). A log of
// zeros also mounts, but its current LSN (0:0) is no later than the
// metadata's, which xfs_repair takes for a log to reformat. The record is
// padded to the log's 4 KiB stripe unit; the first word of each 512-byte
// block after the header is the cycle, and the header keeps the words it
// replaced (h_cycle_data). Its CRC is left 0, as mkfs.xfs leaves it.
func (w *writer) logHead() []byte {
	p := make([]byte, SectorSize)
	lsn := uint64(logFirstCycle) << 32 // cycle 1, block 0
	be.PutUint32(p[0:], logMagic)
	be.PutUint32(p[4:], logFirstCycle)
	be.PutUint32(p[8:], logVersion)
	be.PutUint32(p[12:], SectorSize-basicBlock) // h_len: the data blocks
	be.PutUint64(p[16:], lsn)
	be.PutUint64(p[24:], lsn)    // h_tail_lsn
	be.PutUint32(p[36:], nullAG) // h_prev_block
	be.PutUint32(p[40:], 1)      // h_num_logops
	be.PutUint32(p[44:], unmountTID)
	be.PutUint32(p[300:], logFmtLinux)
	copy(p[304:320], w.opt.UUID[:])
	be.PutUint32(p[320:], logBufSize)
	op := p[basicBlock:]
	be.PutUint32(op[4:], 8) // oh_len: the unmount record
	op[8], op[9] = logClientLog, logUnmount
	op[12], op[13] = unmountType&0xff, unmountType>>8
	for b := basicBlock; b < SectorSize; b += basicBlock {
		be.PutUint32(p[b:], logFirstCycle)
	}
	return p
}
