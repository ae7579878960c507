package csi

import (
	"context"
	"fmt"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// Health (CSI v1.13, which replaced VolumeCondition) reports what can
// really go wrong with a node-local volume: its data gone, its loop device
// detached or the wrong size, its quota used up; and for the node, a state
// dir that is read-only, gone or full.

func healthEntry(t csi.VolumeHealthErrorType, reason, msg string) *csi.VolumeHealth_VolumeHealthEntry {
	return &csi.VolumeHealth_VolumeHealthEntry{Status: t, Reason: reason, Message: msg}
}

// volumeHealth inspects one volume.
func (d *Driver) volumeHealth(v engine.VolumeRecord) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: v.ID}
	if p := d.eng.PoolOf(v.Pool); v.LocalPath == "" && p.Get().Down != nil {
		h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_INACCESSIBLE, "PoolDown", fmt.Sprintf("pool %s (%s) is down: %v", p.Name, p.Paths.Root, p.Get().Down)))
		return h
	}
	path := d.eng.VolumeDataPath(v)
	if _, err := os.Lstat(path); err != nil {
		h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_INACCESSIBLE, "VolumeDataMissing", "the volume's data at "+path+" is gone: "+err.Error()))
		return h
	}
	if err := d.eng.StandbyBehind(v); err != nil {
		h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DEGRADED, "StandbyBehind", err.Error()))
	}
	if v.AccessType == engine.AccessBlock {
		dev, ok, err := loop.Find(path)
		switch {
		case err != nil || !ok:
			h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DEGRADED, "LoopDeviceDetached", "no loop device is bound to "+path+"; the driver re-attaches it on publish or restart"))
		default:
			if size, err := loop.Size(dev.Path()); err == nil && size < v.CapacityBytes {
				h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DEGRADED, "DeviceSmallerThanVolume", dev.Path()+" is smaller than the volume's capacity"))
			}
		}
		return h
	}
	if err := d.eng.NotGrown(v.ID); err != nil {
		h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DEGRADED, "FileSystemNotGrown", err.Error()))
	}
	if err, ok := d.eng.StuckFreezes()[v.ID]; ok {
		h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DEGRADED, "FileSystemFrozen", "the driver froze the volume's file system for a snapshot and could not thaw it (its pods' writes wait; the driver tries again when it stops and starts): "+err.Error()))
	}
	if d.eng.PoolOf(v.Pool).Get().Quota != engine.QuotaNone {
		if u, err := d.eng.VolumeUsage(v); err == nil && u.Bytes >= v.CapacityBytes {
			h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DEGRADED, "QuotaExhausted", "the volume has used all of its capacity; writes fail with EDQUOT"))
		}
	}
	return h
}

// ControllerGetVolumeHealth reports one volume's health.
func (d *Driver) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (_ *csi.ControllerGetVolumeHealthResponse, err error) {
	defer edge(&err)
	if err := d.checkIDHere("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	v, ok := d.eng.Records.Volumes.Get(req.GetVolumeId())
	if !ok || v.Phase != engine.PhaseReady {
		return nil, d.eng.NotFoundVolume(req.GetVolumeId())
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: d.volumeHealth(v)}, nil
}

// ControllerListVolumeHealth pages through every volume's health.
func (d *Driver) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (_ *csi.ControllerListVolumeHealthResponse, err error) {
	defer edge(&err)
	var ready []engine.VolumeRecord
	for _, v := range d.eng.Records.Volumes.All() {
		if v.Phase == engine.PhaseReady {
			ready = append(ready, v)
		}
	}
	page, next, err := paginate(ready, req.GetStartingToken(), req.GetMaxEntries(), engine.ValidVolumeID, func(v engine.VolumeRecord) string { return v.ID })
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, v := range page {
		resp.Entries = append(resp.Entries, d.volumeHealth(v))
	}
	return resp, nil
}

// NodeGetVolumeHealth reports a volume's health on this node, and whether
// it is really mounted where the CO says it published or staged it.
func (d *Driver) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (_ *csi.NodeGetVolumeHealthResponse, err error) {
	defer edge(&err)
	if err := d.checkIDHere("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	v, ok := d.eng.Records.Volumes.Get(req.GetVolumeId())
	if !ok || v.Phase != engine.PhaseReady {
		return nil, d.eng.NotFoundVolume(req.GetVolumeId())
	}
	h := d.volumeHealth(v)
	for _, p := range []string{req.GetVolumePublishPath(), req.GetStagingTargetPath()} {
		if p == "" {
			continue
		}
		ours, err := d.eng.ShowsVolume(p, v)
		switch {
		case err != nil:
			h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_DEGRADED, "MountUninspectable", err.Error()))
		case !ours && (v.AccessType == engine.AccessMount || p == req.GetVolumePublishPath()):
			h.HealthStatuses = append(h.HealthStatuses, healthEntry(csi.VolumeHealthErrorType_INACCESSIBLE, "NotMounted", "the volume is not mounted at "+p))
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// NodeGetStorageHealth reports the state dir's health (gone, read-only, or
// nearly full) and every pool that is down.
func (d *Driver) NodeGetStorageHealth(ctx context.Context, req *csi.NodeGetStorageHealthRequest) (_ *csi.NodeGetStorageHealthResponse, err error) {
	defer edge(&err)
	resp := &csi.NodeGetStorageHealthResponse{}
	bad := func(t csi.StorageHealthErrorType, reason, msg string) {
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{Status: t, Reason: reason, Message: msg})
	}
	if err := d.eng.Records.Err(); err != nil {
		bad(csi.StorageHealthErrorType_STORAGE_UNREACHABLE, "StateJournalFailed", "the state store refuses changes until the driver restarts: "+err.Error())
	}
	if damaged := d.eng.Records.Damaged(); len(damaged) > 0 {
		bad(csi.StorageHealthErrorType_STORAGE_DEGRADED, "StateRecordsDamaged", fmt.Sprintf("%d state records are damaged (the first: %s, %s); their data is kept, see the driver's log for what to do", len(damaged), damaged[0].Path, damaged[0].Problem))
	}
	if n := d.eng.Unowned.Load(); n > 0 {
		bad(csi.StorageHealthErrorType_STORAGE_DEGRADED, "UnownedData", fmt.Sprintf("%d entries under the volumes and snapshots directories of the pools belong to no record; they are kept, see the driver's log for their paths", n))
	}
	for _, p := range d.eng.PoolList()[1:] {
		if why := d.eng.Recheck(p).Down; why != nil {
			bad(csi.StorageHealthErrorType_STORAGE_UNREACHABLE, "PoolDown", fmt.Sprintf("pool %s (%s) is down: %v; its volumes and snapshots are refused until it is back", p.Name, p.Paths.Root, why))
		}
	}
	if err := engine.ProbeWritable(d.eng.Paths.Tmp(), ".health-probe"); err != nil {
		bad(csi.StorageHealthErrorType_STORAGE_UNREACHABLE, "StateDirNotWritable", d.eng.Paths.Root+": "+err.Error())
		return resp, nil
	}
	fs, err := fsops.Statfs(d.eng.Paths.Root)
	if err != nil {
		bad(csi.StorageHealthErrorType_STORAGE_UNREACHABLE, "StateDirUnreadable", err.Error())
		return resp, nil
	}
	if fs.TotalBytes > 0 && fs.AvailableBytes*20 < fs.TotalBytes {
		bad(csi.StorageHealthErrorType_STORAGE_DEGRADED, "StateDirNearlyFull", "less than 5% of "+d.eng.Paths.Root+"'s file system is free")
	}
	if fs.TotalInodes > 0 && fs.FreeInodes*20 < fs.TotalInodes {
		bad(csi.StorageHealthErrorType_STORAGE_DEGRADED, "StateDirInodesNearlyExhausted", "less than 5% of the inodes are free")
	}
	return resp, nil
}
