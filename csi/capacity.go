package csi

import (
	"context"
	"fmt"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
)

// checkCapacity runs under the store's lock when a volume is reserved, so
// concurrent creates cannot overcommit. It picks a --capacity kind when the
// request named none.
func (d *engine) checkCapacity(v *volumeRecord, all map[string]volumeRecord) error {
	p := d.poolOf(v.Pool)
	st, err := d.usable(p)
	if err != nil {
		return err
	}
	if st.quota == quotaProject && v.AccessType == accessMount {
		assignProjectID(v, all)
	}
	if len(d.cfg.Capacity) > 0 {
		used := map[string]int64{}
		for _, o := range all {
			used[o.Kind] += o.CapacityBytes
		}
		kinds := []string{v.Kind}
		if v.Kind == "" {
			kinds = kinds[:0]
			for k := range d.cfg.Capacity {
				kinds = append(kinds, k)
			}
			sort.Strings(kinds)
		}
		for _, k := range kinds {
			if d.cfg.Capacity[k]-used[k] >= v.CapacityBytes {
				v.Kind = k
				return nil
			}
		}
		return storageErr(ErrNoCapacity, "no simulated capacity left for %d bytes (kinds %v)", v.CapacityBytes, kinds)
	}
	avail, err := d.availableBytes(p, all)
	if err != nil {
		return fmt.Errorf("reading pool %s's free space: %w", p.name, err)
	}
	if v.CapacityBytes > avail {
		return storageErr(ErrNoCapacity, "%d bytes requested but only %d are free in pool %s (%s) after what existing volumes reserve", v.CapacityBytes, avail, p.name, p.paths.root)
	}
	return nil
}

// availableBytes is the state dir's free space minus what directory
// volumes have been promised. A block volume's file is preallocated, so its
// space is already out of the free count. The space directory volumes
// already use is counted twice: GetCapacity errs on the side of caution.
func (d *engine) availableBytes(p *pool, all map[string]volumeRecord) (int64, error) {
	fs, err := fsops.Statfs(p.paths.root)
	if err != nil {
		return 0, err
	}
	avail := fs.AvailableBytes
	for _, o := range all {
		if o.AccessType == accessMount && o.LocalPath == "" && d.poolOf(o.Pool) == p {
			avail -= o.CapacityBytes
		}
	}
	return max(avail, 0), nil
}

// GetCapacity reports what a new volume may still take: the real free
// space of the pool's file system (the StorageClass's pool parameter, else
// the state dir's) less what its volumes reserved, or the rest of a
// simulated --capacity kind.
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (_ *csi.GetCapacityResponse, err error) {
	defer edge(&err)
	kind, pl, err := d.checkVolumeParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	st := pl.get()
	zero := &csi.GetCapacityResponse{}
	if len(req.GetVolumeCapabilities()) > 0 {
		if _, err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			return zero, nil // capabilities this driver cannot serve have no capacity
		}
	}
	if d.cfg.EnableTopology && req.GetAccessibleTopology() != nil && !d.onThisNode(req.GetAccessibleTopology()) {
		return zero, nil
	}
	all := map[string]volumeRecord{}
	for _, v := range d.st.Volumes.All() {
		all[v.ID] = v
	}
	var avail int64
	if len(d.cfg.Capacity) > 0 {
		kinds := []string{kind}
		if kind == "" {
			kinds = kinds[:0]
			for k := range d.cfg.Capacity {
				kinds = append(kinds, k)
			}
		}
		for _, k := range kinds {
			left := d.cfg.Capacity[k]
			for _, v := range all {
				if v.Kind == k {
					left -= v.CapacityBytes
				}
			}
			avail = max(avail, left)
		}
	} else if st.down != nil {
		return zero, nil // a pool that is down has no room now
	} else if avail, err = d.availableBytes(pl, all); err != nil {
		return nil, toStatus(err, "reading pool %s's free space", pl.name)
	}
	if st.quota == quotaNone {
		klog.V(2).InfoS("GetCapacity: directory volume sizes are accounted, not enforced (no project quotas or btrfs quota groups on the state dir)")
	}
	resp := &csi.GetCapacityResponse{AvailableCapacity: avail}
	if d.cfg.MaxVolumeSize > 0 {
		resp.MaximumVolumeSize = wrapperspb.Int64(min(d.cfg.MaxVolumeSize, avail))
	}
	return resp, nil
}
