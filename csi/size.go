package csi

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
)

// rangeOf is the CSI capacity range as the storage side takes it.
func rangeOf(cr *csi.CapacityRange) engine.SizeRange {
	return engine.SizeRange{Required: cr.GetRequiredBytes(), Limit: cr.GetLimitBytes()}
}
