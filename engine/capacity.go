package engine

import (
	"fmt"
	"sort"

	"github.com/hostpath-csi/hostpath/fsops"
)

// checkCapacity runs under the store's lock when a volume is reserved, so
// concurrent creates cannot overcommit. It picks a --capacity kind when the
// request named none.
func (d *Engine) checkCapacity(v *VolumeRecord, all map[string]VolumeRecord) error {
	p := d.PoolOf(v.Pool)
	st, err := d.usable(p)
	if err != nil {
		return err
	}
	if st.Quota == QuotaProject && v.AccessType == AccessMount {
		assignProjectID(v, all)
	}
	if len(d.Config.Capacity) > 0 {
		used := map[string]int64{}
		for _, o := range all {
			used[o.Kind] += o.CapacityBytes
		}
		kinds := []string{v.Kind}
		if v.Kind == "" {
			kinds = kinds[:0]
			for k := range d.Config.Capacity {
				kinds = append(kinds, k)
			}
			sort.Strings(kinds)
		}
		for _, k := range kinds {
			if d.Config.Capacity[k]-used[k] >= v.CapacityBytes {
				v.Kind = k
				return nil
			}
		}
		return StorageErr(ErrNoCapacity, "no simulated capacity left for %d bytes (kinds %v)", v.CapacityBytes, kinds)
	}
	avail, err := d.AvailableBytes(p, all)
	if err != nil {
		return fmt.Errorf("reading pool %s's free space: %w", p.Name, err)
	}
	if v.CapacityBytes > avail {
		return StorageErr(ErrNoCapacity, "%d bytes requested but only %d are free in pool %s (%s) after what existing volumes reserve", v.CapacityBytes, avail, p.Name, p.Paths.Root)
	}
	return nil
}

// AvailableBytes is the state dir's free space minus what directory
// volumes have been promised. A block volume's file is preallocated, so its
// space is already out of the free count. The space directory volumes
// already use is counted twice: GetCapacity errs on the side of caution.
func (d *Engine) AvailableBytes(p *Pool, all map[string]VolumeRecord) (int64, error) {
	fs, err := fsops.Statfs(p.Paths.Root)
	if err != nil {
		return 0, err
	}
	avail := fs.AvailableBytes
	for _, o := range all {
		if o.AccessType == AccessMount && o.LocalPath == "" && d.PoolOf(o.Pool) == p {
			avail -= o.CapacityBytes
		}
	}
	return max(avail, 0), nil
}
