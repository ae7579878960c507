// Package store keeps the driver's records: one small JSON file per
// volume, snapshot and group snapshot, each replaced atomically (temp file
// and rename), with an in-memory index by id and by name. A change is made
// durable by a journal (see journal): one small overwrite and one
// fdatasync, shared by the commits that wait together, where a durable
// file replacement needs two fsyncs. Start redoes the journal's changes
// that a power loss may have taken from the files, so a crash loses at
// most the change in flight, and a change costs the same whatever the
// number of records.
//
// It knows nothing of CSI or gRPC: it returns its own errors (ErrNameTaken
// and the file system's), which the csi package maps to codes in one
// place. It does not lock records across operations; callers hold their
// per-id locks.
package store
