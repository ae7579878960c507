// Package store keeps the driver's records: one small JSON file per
// volume, snapshot and group snapshot, with an in-memory index by id and
// by name. A change is written ahead to a journal (see journal): the new
// file is staged under a temporary name, the change appended and made
// durable with one fdatasync, shared by the commits that wait together,
// and only then is the file renamed into place. Start redoes the
// journal's changes that a power loss may have taken from the files, so a
// crash loses at most the change in flight, a commit that fails before its
// sync changes nothing (one whose sync fails is uncertain until the next
// start), and a change costs the same whatever the number of records. A
// record file that does not hold its record is reported as damaged and
// left alone, never taken for an unfinished change.
//
// It knows nothing of CSI or gRPC: it returns its own errors
// (ErrNameTaken, ErrUncertain and the file system's), which the csi
// package maps to codes in one place. It does not lock records across
// operations; callers hold their per-id locks.
package store
