package engine

// SizeRange is what a request asks of a volume's size: at least required
// bytes (0: no floor), at most limit (0: no limit).
type SizeRange struct{ Required, Limit int64 }

// resolveSize turns a capacity range into the size to create. Block sizes
// round up to the sector size; nothing is ever rounded down.
func (d *Engine) resolveSize(r SizeRange, access string, floor int64) (int64, error) {
	req, lim := r.Required, r.Limit
	if req < 0 || lim < 0 {
		return 0, StorageErr(ErrInvalid, "capacity_range has a negative value (required %d, limit %d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, StorageErr(ErrInvalid, "capacity_range required_bytes %d exceeds limit_bytes %d", req, lim)
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
	if access == AccessBlock && size%blockSectorSize != 0 {
		size += blockSectorSize - size%blockSectorSize
	}
	if lim > 0 && size > lim {
		return 0, StorageErr(ErrOutOfRange, "volume must be at least %d bytes (its source's size, or an image volume's smallest file system, rounded up to %d-byte sectors for block), above limit_bytes %d", size, blockSectorSize, lim)
	}
	if d.Config.MaxVolumeSize > 0 && size > d.Config.MaxVolumeSize {
		return 0, StorageErr(ErrOutOfRange, "requested %d bytes exceeds the largest volume this driver creates (--max-volume-size %d)", size, d.Config.MaxVolumeSize)
	}
	return size, nil
}
