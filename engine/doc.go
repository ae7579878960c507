// Package engine is the driver's storage engine: the records (kept by its
// store package), the per-name and per-id locks, the pools and placement,
// the volume layouts, reconcile at start, the data movement (clones,
// snapshots, restores, pulls from other nodes) and the transfer source
// other nodes read from. It maps nothing onto CSI: it answers in errors
// of its own (storage_errors.go), which package csi turns into gRPC codes.
package engine
