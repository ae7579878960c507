package csi

import (
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
)

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// checkName validates a CO-chosen name: required, UTF-8, no control bytes,
// at most maxNameLen bytes. Names are never used in paths, but they are
// logged and stored, so garbage is refused at the door.
func checkName(field, name string) error {
	if name == "" {
		return invalid("%s is required", field)
	}
	if len(name) > engine.MaxNameLen {
		return invalid("%s is %d bytes long; at most %d are accepted", field, len(name), engine.MaxNameLen)
	}
	if !utf8.ValidString(name) {
		return invalid("%s is not valid UTF-8", field)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return invalid("%s contains control character %U", field, r)
		}
	}
	return nil
}

// checkID requires a non-empty id of sane size; whether it names anything is
// the handler's business (NotFound or, for deletes, success).
func checkID(field, id string) error {
	if id == "" {
		return invalid("%s is required", field)
	}
	if len(id) > engine.MaxNameLen || !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
		return invalid("%s is malformed", field)
	}
	return nil
}

// checkIDHere is checkID for the id of a volume, snapshot or group. The one
// rule for ids of another node: every RPC that takes one answers
// ResourceExhausted, before any lookup, so a CO reschedules the work to
// the node that has the data instead of waiting on NotFound, and a delete
// never reports as gone what still exists elsewhere.
func (d *Driver) checkIDHere(field, id string) error {
	if err := checkID(field, id); err != nil {
		return err
	}
	if tag, other := d.eng.OtherNode(id); other {
		return status.Errorf(codes.ResourceExhausted, "%s %s lives on another node (%s); node-local volumes and snapshots are reachable only there, so the work must run on that node", field, id, tag)
	}
	return nil
}

// supportedModes are the access modes a node-local volume can honour. Every
// MULTI_NODE mode needs the volume on more than one node, which a local
// directory or loop device cannot give.
var supportedModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:        true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:   true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  true,
}

// capabilityAccessType checks one capability and returns its access type.
func capabilityAccessType(c *csi.VolumeCapability) (string, error) {
	if c == nil {
		return "", invalid("a volume capability is empty")
	}
	mode := c.GetAccessMode().GetMode()
	if c.GetAccessMode() == nil || mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return "", invalid("volume capability has no access mode")
	}
	if !supportedModes[mode] {
		return "", invalid("access mode %s is not supported: volumes of this driver live on one node", mode)
	}
	switch at := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Mount:
		if _, err := fsops.ParseMountOptions(at.Mount.GetMountFlags()); err != nil {
			return "", invalid("mount flags %q: %v (bind mounts take ro, nosuid, nodev, noexec, noatime, relatime, sync, ...)", at.Mount.GetMountFlags(), err)
		}
		return engine.AccessMount, nil
	case *csi.VolumeCapability_Block:
		return engine.AccessBlock, nil
	default:
		return "", invalid("volume capability has neither block nor mount access type")
	}
}

// checkCapabilities validates a list of capabilities and returns the one
// access type they agree on.
func checkCapabilities(caps []*csi.VolumeCapability) (string, error) {
	if len(caps) == 0 {
		return "", invalid("volume_capabilities is required")
	}
	access := ""
	for _, c := range caps {
		at, err := capabilityAccessType(c)
		if err != nil {
			return "", err
		}
		if access != "" && at != access {
			return "", invalid("volume capabilities ask for both block and mount access; a volume is one or the other")
		}
		access = at
	}
	return access, nil
}

// checkVolumeParameters accepts only parameters the driver understands and
// returns the capacity kind.
func (d *Driver) checkVolumeParameters(params map[string]string) (string, *engine.Pool, error) {
	kind := ""
	for k, v := range params {
		switch {
		case k == engine.ParamKind:
			if len(d.eng.Config.Capacity) == 0 {
				return "", nil, invalid("parameter %s=%q: no simulated capacity is configured (--capacity %s=SIZE)", k, v, v)
			}
			if _, ok := d.eng.Config.Capacity[v]; !ok {
				return "", nil, invalid("parameter %s=%q names no configured --capacity kind", k, v)
			}
			kind = v
		case k == engine.ParamPool:
		case k == engine.ParamLayout:
			if v != engine.LayoutDirectory && v != engine.LayoutImage {
				return "", nil, invalid("parameter %s=%q: want %s (a directory in the pool, the default) or %s (an image file with a file system of its own, for snapshots at one instant)", k, v, engine.LayoutDirectory, engine.LayoutImage)
			}
		case k == engine.ParamStandby, k == engine.ParamStandbyInterval:
		case strings.HasPrefix(k, engine.CoParamPrefix):
		default:
			return "", nil, invalid("unknown parameter %q; this driver accepts %q, %q, %q, %q, %q and the %s* metadata the provisioner adds", k, engine.ParamPool, engine.ParamKind, engine.ParamLayout, engine.ParamStandby, engine.ParamStandbyInterval, engine.CoParamPrefix)
		}
	}
	if _, _, err := engine.CheckStandbyParams(params); err != nil {
		return "", nil, err
	}
	p, err := d.eng.ChoosePool(params)
	return kind, p, err
}

// nodeTopology is this node's one segment.
func (d *Driver) nodeTopology() *csi.Topology {
	return &csi.Topology{Segments: map[string]string{TopologyKey: d.eng.Config.NodeID}}
}

// onThisNode reports whether a topology names this node.
func (d *Driver) onThisNode(t *csi.Topology) bool {
	v, ok := t.GetSegments()[TopologyKey]
	return ok && v == d.eng.Config.NodeID
}

// checkTopology refuses a requisite topology that excludes this node, with
// ResourceExhausted so the provisioner tries another node.
func (d *Driver) checkTopology(req *csi.TopologyRequirement) error {
	if !d.eng.Config.EnableTopology || len(req.GetRequisite()) == 0 {
		return nil
	}
	for _, t := range req.GetRequisite() {
		if d.onThisNode(t) {
			return nil
		}
	}
	return status.Errorf(codes.ResourceExhausted, "the requisite topology does not include this node (%s=%s); volumes are created only on the node that serves the request", TopologyKey, d.eng.Config.NodeID)
}

// checkCOPath validates a path the CO hands over (target or staging path):
// absolute, no NUL, and not inside the driver's state dir, so no request can
// make the driver mount over its own data.
func (d *Driver) checkCOPath(field, p string) (string, error) {
	if p == "" {
		return "", invalid("%s is required", field)
	}
	if len(p) > engine.MaxPathLen || strings.ContainsRune(p, 0) || !utf8.ValidString(p) {
		return "", invalid("%s is malformed", field)
	}
	if !filepath.IsAbs(p) {
		return "", invalid("%s %q is not an absolute path", field, p)
	}
	clean := filepath.Clean(p)
	if dir := d.eng.OwnDirHolding(clean); dir != "" {
		return "", invalid("%s %q is inside the driver's own directory %s", field, p, dir)
	}
	if real, err := fsops.ResolveParent(clean); err == nil {
		if dir := d.eng.OwnDirHolding(real); dir != "" {
			return "", invalid("%s %q leads into the driver's own directory %s through a symlink", field, p, dir)
		}
	}
	return clean, nil
}

// checkLayout is the layout a CreateVolume asks for, and the file system
// an image volume is to hold: image volumes are mount volumes holding
// ext4 or XFS (a capability names one, or no fs_type). A class that names
// no layout leaves it to the engine (""), except for a capability naming
// another file system: that is a directory volume, as it has always been
// (a directory has no file system of its own to choose).
func checkLayout(params map[string]string, access string, caps []*csi.VolumeCapability) (layout, fs string, err error) {
	layout, named := params[engine.ParamLayout]
	fs, fsErr := checkImageFS(caps...)
	if !named && access == engine.AccessMount && fsErr != nil {
		return engine.LayoutDirectory, "", nil
	}
	if layout != engine.LayoutImage {
		if layout == "" && access == engine.AccessMount {
			return layout, fs, nil // the image layout if the engine's default
		}
		return layout, "", nil
	}
	if access != engine.AccessMount {
		return "", "", invalid("parameter %s=%s is for mount volumes; a block volume is an image already", engine.ParamLayout, layout)
	}
	if fsErr != nil {
		return "", "", fsErr
	}
	return layout, fs, nil
}

// checkImageFS is the file system the capabilities name for an image
// volume ("" for none), refusing one image volumes cannot hold and two
// that differ.
func checkImageFS(caps ...*csi.VolumeCapability) (string, error) {
	fs := ""
	for _, c := range caps {
		f := c.GetMount().GetFsType()
		switch {
		case f == "":
		case !slices.Contains(engine.ImageFSTypes, f):
			return "", invalid("fs_type %q: image volumes hold %s (set csi.storage.k8s.io/fstype to one of them, or nothing for %s)", f, strings.Join(engine.ImageFSTypes, " or "), engine.ImageFSType)
		case fs != "" && f != fs:
			return "", invalid("the capabilities name two file systems, %s and %s", fs, f)
		default:
			fs = f
		}
	}
	return fs, nil
}

// checkHoldsFS refuses a capability naming another file system than the
// one image volume v holds.
func (d *Driver) checkHoldsFS(v engine.VolumeRecord, caps ...*csi.VolumeCapability) error {
	want, err := checkImageFS(caps...)
	if err != nil {
		return err
	}
	return d.eng.HoldsFS(v, want)
}
