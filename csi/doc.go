// Package csi maps CSI requests onto the leaf packages (fsops, loop,
// archive). It owns the driver's state, its locking and the translation of
// errors into gRPC codes; it is the only package that knows what a volume is.
package csi
