// Package ext4 makes an empty ext4 file system with a journal, in-process
// and with a handful of writes, for image volumes: no mkfs process.
//
// It writes only metadata (superblock and descriptor copies, the bitmaps,
// the root directory, lost+found, the journal inode and the journal's
// superblock) onto a target that reads as zeros, so formatting a 10 GiB
// image writes a few hundred KiB whatever its size. The layout is plain
// ext4 as the kernel and e2fsprogs know it: 4 KiB blocks, 256-byte inodes,
// extents, sparse superblocks, an internal jbd2 journal of mke2fs's
// default size, a random UUID per file system.
//
// Why not a library: github.com/diskfs/go-diskfs's ext4 writer (v1.9.4)
// writes every inode table and zero-fills the journal (about 450 MiB of
// writes for 10 GiB), and Microsoft hcsshim's compactext4 makes read-only
// compact images (no journal, RO_COMPAT_READONLY, no UUID) from an
// internal package. Neither makes what a volume needs cheaply.
//
// Grow grows such a file system offline, while nothing has it mounted,
// for hosts where the kernel's online resize is not allowed (it needs
// CAP_SYS_RESOURCE); grow.go says what it takes and what a power cut in
// the middle leaves.
//
// What is not made yet: metadata_csum and 64bit (so at most 16 TiB),
// flex_bg and a resize inode. Like loop and fsops, the package knows
// nothing of CSI, never logs, and returns errors that unwrap to the errno.
package ext4
