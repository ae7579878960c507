// Package csi maps CSI requests onto the leaf packages (fsops, loop,
// archive). It owns the driver's state (kept by its store package), its
// locking and the translation of errors into gRPC codes, in errors.go.
package csi
