package csi

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// Volume and snapshot ids are made by the driver: a prefix and 24 lower-case
// hex digits. Every id that arrives in a request is checked against that
// form before it is used in a path, so no request can name a file outside
// the driver's directories.
const (
	volumeIDPrefix   = "vol-"
	snapshotIDPrefix = "snap-"
	idHexLen         = 24
)

func newID(prefix string) string {
	b := make([]byte, idHexLen/2)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	return prefix + hex.EncodeToString(b)
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
