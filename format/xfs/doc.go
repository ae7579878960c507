// Package xfs makes an empty XFS file system in-process, for image
// volumes whose StorageClass asks csi.storage.k8s.io/fstype xfs: no
// mkfs.xfs process.
//
// Like format/ext4 it writes only metadata onto a target that reads as
// zeros: per allocation group a superblock copy, the AGF, AGI and AGFL
// headers, the roots of the free-space and inode btrees; in the first
// group one chunk of 64 inodes (the root directory, the realtime bitmap
// and summary inodes); about 120 KiB for 10 GiB. The internal log is left
// zeroed, which the kernel and xfs_repair read as a clean, empty log.
//
// The file system is the one mkfs.xfs (xfsprogs 6.1) makes with
// -s size=4096 -m crc=1,finobt=0,reflink=0,rmapbt=0,bigtime=1,inobtcount=0
// -i sparse=0,nrext64=0 -n ftype=1: a v5 (CRC) XFS of 4 KiB blocks and
// sectors (an image volume's loop device has 4 KiB logical blocks), four
// allocation groups up to 1 TiB each, a log of mkfs's default size. Its
// tests hold every header to mkfs.xfs's, field by field through xfs_db,
// and have xfs_repair -n find it clean and the kernel mount and fill it.
//
// Left out, as the options above say: the free-inode btree, reflink
// (refcount btree) and reverse mapping, sparse inode chunks, large extent
// counts. An image volume's own file system needs none of them (its
// snapshots are reflinks of the whole image in the pool). Like loop and
// fsops, the package knows nothing of CSI, never logs, and returns errors
// that unwrap to the errno.
package xfs
