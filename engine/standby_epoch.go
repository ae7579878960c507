package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/transfer"
)

// The return of a primary after a failover (docs/standby.md). A primary
// whose node was fenced and whose standby promoted the volume still holds
// the volume at its old epoch when it comes back. Before it stages the
// volume again, it asks the node its record names as the standby which
// epoch that node holds the volume at (SourceEpoch, asked, not sent): a
// higher one means it was superseded, and it becomes that node's standby,
// its data past the generation the other node promoted dropped (the
// fence's loss), so that the stage moves the volume back with what was
// written there. A standby that cannot be asked leaves the stage to go on:
// the fence that let it promote keeps pods off this node while it stands,
// and an administrator lifts it once the node is back, when the other node
// is normally reachable again.

// errNotAsked is superseded's error when the standby cannot be asked:
// no answer, which leaves the volume where it is.
var errNotAsked = errors.New("the standby cannot be asked")

// checkSuperseded asks, for each volume this node holds with a standby
// and has not staged, whether the standby holds it at a higher epoch (it
// promoted it while this node was fenced), and makes this node the
// standby of those it does: a primary that comes back catches up without
// waiting for a pod of the volume to be staged here.
func (d *Engine) checkSuperseded(ctx context.Context) {
	for _, v := range d.Records.Volumes.All() {
		if ctx.Err() != nil {
			return
		}
		// One handed to its standby is asked too: a move whose notice
		// never came, or a demotion a crash cut, is finished so.
		if v.Phase != PhaseReady || v.Standby == "" || (v.HandedTo != "" && v.HandedTo != v.Standby) || len(v.Staged) > 0 || len(v.Published) > 0 {
			continue
		}
		if _, err := d.superseded(ctx, v); err != nil && !errors.Is(err, errNotAsked) {
			klog.ErrorS(err, "asking a volume's standby whether it promoted it", "volume_id", v.ID, "standby", v.Standby)
		}
	}
}

// SourceEpoch is the transfer kind a node asks another for the epoch it
// holds a volume at (stat only; the id is the volume's).
const SourceEpoch = "epoch"

// Attributes of SourceEpoch's answer.
const (
	attrHolds      = "holds"      // "volume" or "copy"
	attrEpoch      = "epoch"      // the record's epoch
	attrGeneration = "generation" // for a volume: the cut its standby goes on from
)

// AuthorizeEpoch allows peer to ask about volume id when this node's own
// records tie it to the volume: as the standby of this node's volume, or
// as the primary of the copy this node keeps.
func (d *Engine) AuthorizeEpoch(peer, id string) error {
	if v, ok := d.Records.Volumes.Get(id); ok && v.Standby == peer {
		return nil
	}
	if s, ok := d.Records.Standbys.Get(id); ok && s.Primary == peer {
		return nil
	}
	return fmt.Errorf("%w: node %s is neither the standby nor the primary of volume %s here", transfer.ErrRefused, peer, id)
}

// serveEpoch answers which epoch this node holds volume id at, and as
// what.
func (d *Engine) serveEpoch(peer, id string) (transfer.Meta, error) {
	if err := d.AuthorizeEpoch(peer, id); err != nil {
		return transfer.Meta{}, err
	}
	if v, ok := d.Records.Volumes.Get(id); ok && v.Phase == PhaseReady && v.HandedTo == "" {
		m := transfer.Meta{Attrs: map[string]string{attrHolds: "volume", attrEpoch: strconv.FormatUint(v.Epoch, 10)}}
		if cuts, err := generations(standbyDir(d.PoolOf(v.Pool).Paths.Root, id), "cut"); err == nil && len(cuts) > 0 {
			m.Attrs[attrGeneration] = strconv.FormatUint(cuts[0], 10)
		}
		return m, nil
	}
	if s, ok := d.Records.Standbys.Get(id); ok {
		return transfer.Meta{Attrs: map[string]string{attrHolds: "copy", attrEpoch: strconv.FormatUint(s.Epoch, 10)}}, nil
	}
	return transfer.Meta{}, fmt.Errorf("%w: volume %s is not held here", transfer.ErrNotFound, id)
}

// superseded asks v's standby node whether it holds v at a higher epoch
// (it promoted while this node was fenced) and, if so, makes this node its
// standby (demote): the generation the other node keeps as its standby's
// base becomes this node's, if this node holds that cut. A standby that
// cannot be asked is no answer: false.
func (d *Engine) superseded(ctx context.Context, v VolumeRecord) (bool, error) {
	peers := d.peerSet()
	if peers == nil {
		return false, nil
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, _, node, err := peers.Open(actx, NodeTag(v.Standby), SourceEpoch, v.ID, true)
	if err != nil {
		return false, fmt.Errorf("%w: %v", errNotAsked, err)
	}
	epoch, _ := strconv.ParseUint(m.Attrs[attrEpoch], 10, 64)
	if m.Attrs[attrHolds] != "volume" || epoch <= v.Epoch {
		return false, nil
	}
	g, _ := strconv.ParseUint(m.Attrs[attrGeneration], 10, 64)
	cur, unlock, err := d.lockVolume(v.ID, true)
	if err != nil {
		return false, err
	}
	defer unlock()
	if len(cur.Staged) > 0 || len(cur.Published) > 0 {
		return false, StorageErr(ErrInUse, "volume %s is held by node %s at a newer epoch (%d, this node's %d): it was promoted there while this node was fenced; unstage it here first", v.ID, node, epoch, cur.Epoch)
	}
	// Never staged here again, durably, before anything moves; a crash
	// after it is resumed by the next checkSuperseded.
	if cur.HandedTo != v.Standby {
		cur.HandedTo = v.Standby
		if err := d.Records.Volumes.Put(cur); err != nil {
			return false, err
		}
	}
	// Its data is set aside, not removed: the answer is the other node's
	// word, and what this node wrote past the promoted generation is kept
	// (until the volume is deleted) for an administrator to read.
	dir := standbyDir(d.PoolOf(cur.Pool).Paths.Root, cur.ID)
	aside := filepath.Join(dir, "superseded-"+strconv.FormatUint(cur.Epoch, 10)+".img")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	// A copy (a reflink: a standby's pool shares blocks), so that the
	// volume's file and its devices go as any volume's do (demote).
	if _, err := os.Lstat(aside); err != nil {
		if err := placeCopy(ctx, d.VolumeDataPath(cur), aside); err != nil {
			return false, err
		}
	}
	cur.Epoch = epoch - 1 // the copy's record takes the owner's epoch
	if err := d.demote(cur, g); err != nil {
		return false, err
	}
	klog.InfoS("this node was superseded as a volume's primary while it was fenced: it keeps the volume's standby copy now", "volume_id", v.ID, "owner", v.Standby, "epoch", epoch, "generation", g)
	return true, nil
}
