package engine

import (
	"fmt"
	"slices"
	"strings"
)

// AttachVolume records volume id as attached to node (which must be this
// one), with the read-only flag; an attachment already there is success,
// one with the other flag is ErrExists.
func (d *Engine) AttachVolume(id, node, access string, readOnly bool) error {
	v, unlock, err := d.lockVolume(id, false)
	if err != nil {
		return err
	}
	defer unlock()
	if node != d.Config.NodeID {
		return StorageErr(ErrNotFound, "node %q is not this driver's node %q; a local volume can only be attached where it lives", node, d.Config.NodeID)
	}
	if access != v.AccessType {
		return StorageErr(ErrInvalid, "volume %s is a %s volume; the capability asks for %s", id, v.AccessType, access)
	}
	key := attachKey(node, readOnly)
	if slices.Contains(v.AttachedNodes, key) {
		return nil
	}
	if slices.Contains(v.AttachedNodes, attachKey(node, !readOnly)) {
		return StorageErr(ErrExists, "volume %s is already attached to %s with readonly=%v", id, node, !readOnly)
	}
	d.attachMu.Lock()
	defer d.attachMu.Unlock()
	if max := d.Config.MaxVolumesPerNode; max > 0 && d.AttachedCount(node) >= max {
		return StorageErr(ErrNoCapacity, "node %s already has %d volumes attached, its limit (--maxvolumespernode)", node, max)
	}
	v.AttachedNodes = append(v.AttachedNodes, key)
	if err := d.Records.Volumes.Put(v); err != nil {
		return fmt.Errorf("recording attachment of volume %s: %w", id, err)
	}
	return nil
}

// attachKey records an attachment with its read-only flag; the node id
// comes back from nodeOfAttachment.
func attachKey(node string, readOnly bool) string {
	if readOnly {
		return node + "\x00ro"
	}
	return node
}

func nodeOfAttachment(key string) string {
	n, _ := strings.CutSuffix(key, "\x00ro")
	return n
}

// AttachedCount is how many volumes are attached to node: what
// MaxVolumesPerNode is checked against.
func (d *Engine) AttachedCount(node string) int64 {
	var n int64
	for _, v := range d.Records.Volumes.All() {
		if slices.ContainsFunc(v.AttachedNodes, func(k string) bool { return nodeOfAttachment(k) == node }) {
			n++
		}
	}
	return n
}

// AttachedNodes lists the node ids a volume is attached to.
func AttachedNodes(v VolumeRecord) []string {
	var out []string
	for _, k := range v.AttachedNodes {
		if n := nodeOfAttachment(k); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// DetachVolume forgets volume id's attachments to node (to every node if
// node is empty); what is not attached, or not there, is success.
func (d *Engine) DetachVolume(id, node string) error {
	unlock, err := d.Locks.lock("volume "+id, VolIDKey(id))
	if err != nil {
		return err
	}
	defer unlock()
	v, ok := d.Records.Volumes.Get(id)
	if !ok {
		return nil
	}
	kept := v.AttachedNodes[:0:0]
	for _, k := range v.AttachedNodes {
		if node != "" && nodeOfAttachment(k) != node {
			kept = append(kept, k)
		}
	}
	if len(kept) != len(v.AttachedNodes) {
		v.AttachedNodes = kept
		if err := d.Records.Volumes.Put(v); err != nil {
			return fmt.Errorf("recording detachment of volume %s: %w", id, err)
		}
	}
	return nil
}
