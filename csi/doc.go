// Package csi serves the CSI services over the storage engine (package
// engine): each handler validates its request, makes one call into the
// engine, and maps what it answers onto a gRPC code in one place
// (errors.go).
package csi
