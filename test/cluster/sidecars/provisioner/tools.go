//go:build tools

// Package provisioner records the commands built from external-provisioner, for go mod tidy;
// it is never compiled.
package provisioner

import (
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
)
