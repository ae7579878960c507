package engine

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strings"
)

// Volume and snapshot ids are made by the driver: a prefix and 24 lower-case
// hex digits, the first 8 a hash of the node id and the rest random. Every
// id that arrives in a request is checked against that form before it is
// used in a path, so no request can name a file outside the driver's
// directories. The node hash lets a driver tell "this volume or snapshot
// lives on another node" (ResourceExhausted: reschedule) from "it does not
// exist" (NotFound), which the reference driver confuses into a restore
// that waits forever.
const (
	VolumeIDPrefix   = "vol-"
	SnapshotIDPrefix = "snap-"
	GroupIDPrefix    = "group-"
	idHexLen         = 24
)

const nodeTagLen = 8

// NodeTag is the id prefix of a node's volumes and snapshots: how a peer
// resolver finds the node an id lives on.
func NodeTag(nodeID string) string {
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	return fmt.Sprintf("%08x", h.Sum32())
}

// NewID is a fresh random ID with the given prefix, carrying the node tag
// tag so that any node can tell whose it is.
func NewID(prefix, tag string) string {
	b := make([]byte, (idHexLen-nodeTagLen)/2)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	return prefix + tag + hex.EncodeToString(b)
}

// NewVolumeID and newSnapshotID make ids of this node.
func (d *Engine) NewVolumeID() string   { return NewID(VolumeIDPrefix, d.Tag) }
func (d *Engine) newSnapshotID() string { return NewID(SnapshotIDPrefix, d.Tag) }

// KeyOf is the node tag a well-formed volume, snapshot or group id
// carries (NodeTag of the node that made it), and whether it is one.
func KeyOf(id string) (string, bool) {
	for _, p := range []string{VolumeIDPrefix, SnapshotIDPrefix, GroupIDPrefix} {
		if validID(p, id) {
			return id[len(p) : len(p)+nodeTagLen], true
		}
	}
	return "", false
}

// OtherNode reports whether a well-formed id is of another node, and
// which: the node that made it, but for a volume with a standby copy,
// which keeps its id as it moves. A volume promoted here (PromoteStandby)
// is this node's; one this node made and handed over, of which it now
// keeps the copy, is its new owner's.
func (d *Engine) OtherNode(id string) (string, bool) {
	for _, p := range []string{VolumeIDPrefix, SnapshotIDPrefix, GroupIDPrefix} {
		if validID(p, id) {
			tag := id[len(p) : len(p)+nodeTagLen]
			if p == VolumeIDPrefix {
				if v, ok := d.Records.Volumes.Get(id); ok && v.Epoch > 0 {
					return "", false
				}
				if s, ok := d.Records.Standbys.Get(id); ok && tag == d.Tag {
					return "node " + s.Primary, true
				}
			}
			return "node tag " + tag, tag != d.Tag
		}
	}
	return "", false
}

// nodeTagOf is the tag of the node a well-formed id was made on, "" for
// an id that is none.
func nodeTagOf(id string) string {
	for _, p := range []string{VolumeIDPrefix, SnapshotIDPrefix, GroupIDPrefix} {
		if validID(p, id) {
			return id[len(p) : len(p)+nodeTagLen]
		}
	}
	return ""
}

func validID(prefix, id string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || len(rest) != idHexLen {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ValidVolumeID reports whether id has the form of a volume ID this driver
// makes (an ID of any other form names nothing here).
func ValidVolumeID(id string) bool { return validID(VolumeIDPrefix, id) }

// ValidSnapshotID reports whether id has the form of a snapshot ID.
func ValidSnapshotID(id string) bool { return validID(SnapshotIDPrefix, id) }

// ValidGroupID reports whether id has the form of a group snapshot ID.
func ValidGroupID(id string) bool { return validID(GroupIDPrefix, id) }
