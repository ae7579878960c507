package csi

import "github.com/container-storage-interface/spec/lib/go/csi"

// sizeRange is what a request asks of a volume's size: at least required
// bytes (0: no floor), at most limit (0: no limit).
type sizeRange struct{ required, limit int64 }

// rangeOf is the CSI capacity range as the storage side takes it.
func rangeOf(cr *csi.CapacityRange) sizeRange {
	return sizeRange{required: cr.GetRequiredBytes(), limit: cr.GetLimitBytes()}
}

// resolveSize turns a capacity range into the size to create. Block sizes
// round up to the sector size; nothing is ever rounded down.
func (d *engine) resolveSize(r sizeRange, access string, floor int64) (int64, error) {
	req, lim := r.required, r.limit
	if req < 0 || lim < 0 {
		return 0, storageErr(ErrInvalid, "capacity_range has a negative value (required %d, limit %d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, storageErr(ErrInvalid, "capacity_range required_bytes %d exceeds limit_bytes %d", req, lim)
	}
	size := req
	if size == 0 {
		// No size asked: a clone or restore takes its source's, a new
		// volume the default, within the limit.
		size = defaultVolumeSize
		if floor > 0 {
			size = floor
		}
		if lim > 0 && size > lim {
			size = lim
		}
	}
	if size < floor {
		size = floor
	}
	if access == accessBlock && size%blockSectorSize != 0 {
		size += blockSectorSize - size%blockSectorSize
	}
	if lim > 0 && size > lim {
		return 0, storageErr(ErrOutOfRange, "volume must be at least %d bytes (its source's size, rounded up to %d-byte sectors for block), above limit_bytes %d", size, blockSectorSize, lim)
	}
	if d.cfg.MaxVolumeSize > 0 && size > d.cfg.MaxVolumeSize {
		return 0, storageErr(ErrOutOfRange, "requested %d bytes exceeds the largest volume this driver creates (--max-volume-size %d)", size, d.cfg.MaxVolumeSize)
	}
	return size, nil
}
