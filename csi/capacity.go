package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"
)

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
	st := pl.Get()
	zero := &csi.GetCapacityResponse{}
	if len(req.GetVolumeCapabilities()) > 0 {
		if _, err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			return zero, nil // capabilities this driver cannot serve have no capacity
		}
	}
	if d.eng.Config.EnableTopology && req.GetAccessibleTopology() != nil && !d.onThisNode(req.GetAccessibleTopology()) {
		return zero, nil
	}
	all := map[string]engine.VolumeRecord{}
	for _, v := range d.eng.Records.Volumes.All() {
		all[v.ID] = v
	}
	var avail int64
	if len(d.eng.Config.Capacity) > 0 {
		kinds := []string{kind}
		if kind == "" {
			kinds = kinds[:0]
			for k := range d.eng.Config.Capacity {
				kinds = append(kinds, k)
			}
		}
		for _, k := range kinds {
			left := d.eng.Config.Capacity[k]
			for _, v := range all {
				if v.Kind == k {
					left -= v.CapacityBytes
				}
			}
			avail = max(avail, left)
		}
	} else if st.Down != nil {
		return zero, nil // a pool that is down has no room now
	} else if avail, err = d.eng.AvailableBytes(pl, all); err != nil {
		return nil, toStatus(err, "reading pool %s's free space", pl.Name)
	}
	if st.Quota == engine.QuotaNone {
		klog.V(2).InfoS("GetCapacity: directory volume sizes are accounted, not enforced (no project quotas or btrfs quota groups on the state dir)")
	}
	resp := &csi.GetCapacityResponse{AvailableCapacity: avail}
	if d.eng.Config.MaxVolumeSize > 0 {
		resp.MaximumVolumeSize = wrapperspb.Int64(min(d.eng.Config.MaxVolumeSize, avail))
	}
	return resp, nil
}
