//go:build tools

// Package resizer records the commands built from external-resizer, for go mod tidy;
// it is never compiled.
package resizer

import (
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
)
