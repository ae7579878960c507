// Package store keeps the driver's records: one small JSON file per
// volume, snapshot and group snapshot, each replaced atomically (temp file,
// fsync, rename, fsync of the directory), with an in-memory index by id
// and by name. A change to one record costs one small write whatever the
// number of records, and a crash loses at most the change in flight.
//
// It knows nothing of CSI or gRPC: it returns its own errors (ErrNameTaken
// and the file system's), which the csi package maps to codes in one
// place. It does not lock records across operations; callers hold their
// per-id locks.
package store
