//go:build tools

// Package snapshotter records the commands built from external-snapshotter, for go mod tidy;
// it is never compiled.
package snapshotter

import (
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)
