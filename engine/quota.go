package engine

import (
	"hash/fnv"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
)

// QuotaMode is how directory volumes get a hard size limit.
type QuotaMode int

const (
	// QuotaNone means the file system cannot limit a directory; capacity is
	// accounted, not enforced.
	QuotaNone QuotaMode = iota
	// QuotaProject is XFS, or ext4 with the project feature, mounted with
	// prjquota: each volume is a project with a hard limit.
	QuotaProject
	// QuotaBtrfs is btrfs with quota groups on: each volume is a subvolume
	// with a qgroup limit.
	QuotaBtrfs
)

func (q QuotaMode) String() string {
	return [...]string{"none", "project quota", "btrfs qgroup"}[q]
}

// detectQuota finds what the state dir's file system offers and says so
// once, at start.
func detectQuota(dir string) QuotaMode {
	projErr := fsops.ProjectQuotaSupported(dir)
	if projErr == nil {
		klog.InfoS("directory volumes get a hard limit", "mechanism", QuotaProject.String(), "dir", dir)
		return QuotaProject
	}
	if fsops.IsBtrfs(dir) {
		err := fsops.BtrfsQuotaEnabled(dir)
		if err == nil {
			klog.InfoS("directory volumes get a hard limit", "mechanism", QuotaBtrfs.String(), "dir", dir)
			return QuotaBtrfs
		}
		klog.InfoS("capacity of directory volumes is accounted, not enforced: btrfs quota groups are off (btrfs quota enable turns them on)", "dir", dir)
		return QuotaNone
	}
	klog.InfoS("capacity of directory volumes is accounted, not enforced: the state dir's file system has no project quotas (XFS or ext4 with the project feature, mounted with prjquota)", "dir", dir, "reason", projErr)
	return QuotaNone
}

// assignProjectID gives a new volume a project id no other volume has. It
// runs under the store's lock, with every record in view.
func assignProjectID(v *VolumeRecord, all map[string]VolumeRecord) {
	used := make(map[uint32]bool, len(all))
	for _, o := range all {
		used[o.ProjectID] = true
	}
	h := fnv.New32a()
	h.Write([]byte(v.ID))
	// Ids below 1<<16 are left to the operator's own projects.
	id := 1<<16 + h.Sum32()%(1<<30)
	for used[id] {
		id++
	}
	v.ProjectID = id
}

// makeVolumeDir creates a directory volume with its limit.
func (d *Engine) makeVolumeDir(v VolumeRecord, dir string) error {
	p := d.PoolOf(v.Pool)
	switch p.Get().Quota {
	case QuotaBtrfs:
		if err := fsops.CreateSubvolume(dir); err != nil {
			return err
		}
		return fsops.SetSubvolumeLimit(dir, v.CapacityBytes)
	case QuotaProject:
		if err := mkdirOpen(dir); err != nil {
			return err
		}
		if err := fsops.SetProject(dir, v.ProjectID); err != nil {
			return err
		}
		return fsops.SetProjectLimit(p.Paths.Volumes(), v.ProjectID, v.CapacityBytes)
	}
	return mkdirOpen(dir)
}

// setVolumeLimit gives an existing directory volume a new limit.
func (d *Engine) setVolumeLimit(v VolumeRecord, size int64) error {
	p := d.PoolOf(v.Pool)
	switch p.Get().Quota {
	case QuotaBtrfs:
		return fsops.SetSubvolumeLimit(d.VolumeDataPath(v), size)
	case QuotaProject:
		return fsops.SetProjectLimit(p.Paths.Volumes(), v.ProjectID, size)
	}
	return nil
}

// VolumeUsage is what a directory volume uses: the quota's count where
// there is one, else a walk of the tree.
func (d *Engine) VolumeUsage(v VolumeRecord) (fsops.Usage, error) {
	if p := d.PoolOf(v.Pool); p.Get().Quota == QuotaProject && v.ProjectID != 0 {
		u, err := fsops.GetProjectUsage(p.Paths.Volumes(), v.ProjectID)
		if err == nil {
			return fsops.Usage{Bytes: u.UsedBytes, Inodes: u.Inodes}, nil
		}
	}
	return fsops.TreeUsage(d.VolumeDataPath(v))
}
