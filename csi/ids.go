package csi

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
	volumeIDPrefix   = "vol-"
	snapshotIDPrefix = "snap-"
	groupIDPrefix    = "group-"
	idHexLen         = 24
)

const nodeTagLen = 8

// nodeTag is the id prefix of a node's volumes and snapshots.
func nodeTag(nodeID string) string {
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	return fmt.Sprintf("%08x", h.Sum32())
}

func newID(prefix, tag string) string {
	b := make([]byte, (idHexLen-nodeTagLen)/2)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	return prefix + tag + hex.EncodeToString(b)
}

// newVolumeID and newSnapshotID make ids of this node.
func (d *engine) newVolumeID() string   { return newID(volumeIDPrefix, d.tag) }
func (d *engine) newSnapshotID() string { return newID(snapshotIDPrefix, d.tag) }

// otherNode reports whether a well-formed id was made by another node,
// and that node's tag.
func (d *engine) otherNode(id string) (string, bool) {
	for _, p := range []string{volumeIDPrefix, snapshotIDPrefix, groupIDPrefix} {
		if validID(p, id) {
			tag := id[len(p) : len(p)+nodeTagLen]
			return "node tag " + tag, tag != d.tag
		}
	}
	return "", false
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

func validVolumeID(id string) bool   { return validID(volumeIDPrefix, id) }
func validSnapshotID(id string) bool { return validID(snapshotIDPrefix, id) }
func validGroupID(id string) bool    { return validID(groupIDPrefix, id) }
