package engine

import (
	"context"
	"fmt"
	"hash/fnv"
	"time"
)

// Class parameters of standby copies (docs/standby.md).
const (
	// ParamStandby "1" keeps a copy of each image or block volume on a
	// second node.
	ParamStandby = "standby"
	// ParamStandbyInterval is how often the standby catches up (a Go
	// duration, at least a second; DefaultStandbyInterval when unset).
	ParamStandbyInterval = "standbyInterval"
)

// Volume context keys of a volume with a standby copy: the PV carries
// them, and the standby's node learns from it that it keeps a copy, of
// which node's volume, in which pool, how often caught up.
const (
	CtxStandby         = "hostpath.csi/standby"
	CtxPrimary         = "hostpath.csi/primary"
	CtxStandbyPool     = "hostpath.csi/standbyPool"
	CtxStandbyInterval = "hostpath.csi/standbyInterval"
)

// StandbyContext is the volume context of v, a volume of node primary
// with a standby copy (nil without one).
func StandbyContext(v VolumeRecord, primary string) map[string]string {
	if v.Standby == "" {
		return nil
	}
	_, every, _ := CheckStandbyParams(v.Parameters)
	return map[string]string{CtxStandby: v.Standby, CtxPrimary: primary, CtxStandbyPool: v.Pool, CtxStandbyInterval: every.String()}
}

// DefaultStandbyInterval is how often a standby catches up when its class
// names no interval.
const DefaultStandbyInterval = 10 * time.Second

// StandbyNodes lists the nodes that run this driver, by name: where a
// standby copy may be kept.
type StandbyNodes func(ctx context.Context) ([]string, error)

// SetStandbyNodes lets volumes have standby copies. Without it (outside a
// cluster) a class asking for one is refused.
func (d *Engine) SetStandbyNodes(f StandbyNodes) { d.standbyNodes.Store(&f) }

// CheckStandbyParams checks the standby parameters of a class: whether it
// asks for a copy, and how often it catches up.
func CheckStandbyParams(params map[string]string) (bool, time.Duration, error) {
	on := false
	switch v := params[ParamStandby]; v {
	case "", "0":
	case "1":
		on = true
	default:
		return false, 0, StorageErr(ErrInvalid, "parameter %s=%q: want \"1\" (a copy on a second node) or \"0\"", ParamStandby, v)
	}
	every := DefaultStandbyInterval
	if v, ok := params[ParamStandbyInterval]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return false, 0, StorageErr(ErrInvalid, "parameter %s=%q: want a duration of at least 1s (10s when unset)", ParamStandbyInterval, v)
		}
		every = d
	}
	return on, every, nil
}

// chooseStandby is the node that keeps the standby copy of volume rec
// (named name), in pool p: among the other nodes that run the driver,
// the one a hash of the name and the node ranks first (rendezvous
// hashing: a retry of the same name chooses the same node while they are
// the same, and volumes spread over the nodes). Only image and block
// volumes in pools that share blocks have one: the standby's generations
// and the primary's cuts are reflinks, which an ext4 pool cannot make, so
// each would be a full copy every interval.
func (d *Engine) chooseStandby(ctx context.Context, name string, rec VolumeRecord, p *Pool) (string, error) {
	if !fileBacked(rec) {
		return "", StorageErr(ErrInvalid, "parameter %s=1: a standby copy is kept of image and block volumes only (layout: image, or a raw block claim); this is a directory volume", ParamStandby)
	}
	// A pool that is down says so when the volume is made.
	if st := p.Get(); st.Down == nil && !st.Reflink {
		return "", StorageErr(ErrInvalid, "parameter %s=1: pool %s cannot share blocks (its file system has no reflink, as ext4), and a standby is kept by reflinked cuts; use a pool on XFS or btrfs", ParamStandby, p.Name)
	}
	f := d.standbyNodes.Load()
	if f == nil {
		return "", StorageErr(ErrInvalid, "parameter %s=1: this driver runs outside a cluster, with no other node to keep a standby copy on", ParamStandby)
	}
	nodes, err := (*f)(ctx)
	if err != nil {
		return "", fmt.Errorf("finding a node for the standby copy: %w", err)
	}
	best, bestScore := "", uint64(0)
	for _, n := range nodes {
		if n == d.Config.NodeID {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(name + "\x00" + n))
		if s := h.Sum64(); best == "" || s > bestScore {
			best, bestScore = n, s
		}
	}
	if best == "" {
		return "", StorageErr(ErrNoCapacity, "parameter %s=1: no other node runs this driver to keep the standby copy", ParamStandby)
	}
	return best, nil
}
