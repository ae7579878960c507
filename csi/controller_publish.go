package csi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ControllerPublishVolume "attaches" a volume to its node. A node-local
// volume can only be attached to the node it lives on; the attachment is
// recorded so ListVolumes can report it and a conflicting read-only flag is
// caught, as the spec asks.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (_ *csi.ControllerPublishVolumeResponse, err error) {
	defer edge(&err)
	if !d.cfg.EnableAttach {
		return nil, status.Error(codes.Unimplemented, "attach is disabled (start with --enable-attach)")
	}
	id, node := req.GetVolumeId(), req.GetNodeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if err := checkID("node_id", node); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, invalid("volume_capability is required")
	}
	access, err := capabilityAccessType(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if err := d.attachVolume(id, node, access, req.GetReadonly()); err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{}, nil
}

// attachVolume records volume id as attached to node (which must be this
// one), with the read-only flag; an attachment already there is success,
// one with the other flag is ErrExists.
func (d *engine) attachVolume(id, node, access string, readOnly bool) error {
	v, unlock, err := d.lockVolume(id, false)
	if err != nil {
		return err
	}
	defer unlock()
	if node != d.cfg.NodeID {
		return storageErr(ErrNotFound, "node %q is not this driver's node %q; a local volume can only be attached where it lives", node, d.cfg.NodeID)
	}
	if access != v.AccessType {
		return storageErr(ErrInvalid, "volume %s is a %s volume; the capability asks for %s", id, v.AccessType, access)
	}
	key := attachKey(node, readOnly)
	if slices.Contains(v.AttachedNodes, key) {
		return nil
	}
	if slices.Contains(v.AttachedNodes, attachKey(node, !readOnly)) {
		return storageErr(ErrExists, "volume %s is already attached to %s with readonly=%v", id, node, !readOnly)
	}
	d.attachMu.Lock()
	defer d.attachMu.Unlock()
	if max := d.cfg.MaxVolumesPerNode; max > 0 && d.attachedCount(node) >= max {
		return storageErr(ErrNoCapacity, "node %s already has %d volumes attached, its limit (--maxvolumespernode)", node, max)
	}
	v.AttachedNodes = append(v.AttachedNodes, key)
	if err := d.st.Volumes.Put(v); err != nil {
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

func (d *engine) attachedCount(node string) int64 {
	var n int64
	for _, v := range d.st.Volumes.All() {
		if slices.ContainsFunc(v.AttachedNodes, func(k string) bool { return nodeOfAttachment(k) == node }) {
			n++
		}
	}
	return n
}

// attachedNodes lists the node ids a volume is attached to.
func attachedNodes(v volumeRecord) []string {
	var out []string
	for _, k := range v.AttachedNodes {
		if n := nodeOfAttachment(k); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// ControllerUnpublishVolume detaches; what is not attached is success.
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (_ *csi.ControllerUnpublishVolumeResponse, err error) {
	defer edge(&err)
	if !d.cfg.EnableAttach {
		return nil, status.Error(codes.Unimplemented, "attach is disabled (start with --enable-attach)")
	}
	id := req.GetVolumeId()
	if err := d.checkIDHere("volume_id", id); err != nil {
		return nil, err
	}
	if err := d.detachVolume(id, req.GetNodeId()); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// detachVolume forgets volume id's attachments to node (to every node if
// node is empty); what is not attached, or not there, is success.
func (d *engine) detachVolume(id, node string) error {
	unlock, err := d.locks.lock("volume "+id, volIDKey(id))
	if err != nil {
		return err
	}
	defer unlock()
	v, ok := d.st.Volumes.Get(id)
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
		if err := d.st.Volumes.Put(v); err != nil {
			return fmt.Errorf("recording detachment of volume %s: %w", id, err)
		}
	}
	return nil
}
