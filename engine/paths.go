package engine

import (
	"path/filepath"
	"strings"
)

const (
	// MaxNameLen bounds volume and snapshot names. The spec asks for at
	// least 128 bytes; Kubernetes sends "pvc-<uuid>" (40).
	MaxNameLen = 256
	// MaxPathLen is PATH_MAX.
	MaxPathLen = 4096
	// defaultVolumeSize is used when a request names no size.
	defaultVolumeSize = 1 << 30
	// blockSectorSize is the logical block size of a loop device: block
	// volume sizes are rounded up to it, never down.
	blockSectorSize = 512

	// ParamKind selects a simulated --capacity pool, as in the reference.
	ParamKind = "kind"
	// CoParamPrefix marks parameters the external-provisioner adds
	// (csi.storage.k8s.io/pvc/name, ...): accepted and kept as metadata.
	CoParamPrefix = "csi.storage.k8s.io/"
)

// OwnDirHolding is the state dir or pool directory p is in, or "".
func (d *Engine) OwnDirHolding(p string) string {
	if within(d.Paths.Root, p) {
		return d.Paths.Root
	}
	for _, pl := range d.Pools {
		if within(pl.Paths.Root, p) {
			return pl.Paths.Root
		}
	}
	return ""
}

// within reports whether p is dir or below it (both clean and absolute).
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
