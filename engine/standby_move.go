package engine

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/transfer"
)

// Moves (docs/standby.md). A volume with a standby copy may be staged on
// either node (its PV admits both). When its pod comes to the standby's
// node while the primary is up and not fenced (a drain, a rescheduled
// pod), the standby's stage takes the volume over from the primary:
//
//  1. It pulls the last changes by SourceHandover. The primary serves them
//     only once the volume is unstaged there (its pod has stopped), and
//     first records, durably, that it hands the volume to that node
//     (HandedTo): from then on it never stages it again, so nothing
//     writes to it after the cut that is sent.
//  2. It applies them as a generation and promotes it (PromoteStandby):
//     the volume is now its own, at the next epoch, with the old primary
//     as its standby.
//  3. It tells the old primary (SourceHanded, asked, not sent), which
//     becomes the standby: the cut it sent becomes its generation, and it
//     drops its own copy of the data.
//
// Cut anywhere, nothing is lost and never do two nodes stage the volume: a
// primary that has recorded HandedTo refuses stages until the new owner
// tells it (or is fenced, when it takes the volume back at a higher
// epoch); a standby whose pull or promotion failed is retried by kubelet's
// next stage, and the primary serves the handover again; a handed notice
// that never came is finished by the old primary's own asking
// (checkSuperseded). Not built yet: a move abandoned midway (the pod going
// back to the primary before the standby promoted).

// SourceHandover is the transfer kind of a move's last changes (id as
// StandbyID); SourceHanded is the new owner telling the old one that the
// move is done (stat only, id as StandbyID of the generation promoted).
const (
	SourceHandover = "handover"
	SourceHanded   = "handed"
)

// serveHandover is what a standby taking the volume over pulls: refused
// while the volume is staged here; otherwise the volume is recorded handed
// to peer, and its changes are served as a standby's pull is.
func (d *Engine) serveHandover(peer, standbyID string) (transfer.Meta, func(context.Context) (io.ReadCloser, error), func(), error) {
	if err := d.AuthorizeStandby(peer, standbyID); err != nil {
		return transfer.Meta{}, nil, nil, err
	}
	id, _, _ := parseStandbyID(standbyID)
	v, unlock, err := d.lockVolume(id, false)
	if err != nil {
		return transfer.Meta{}, nil, nil, servable(err, SourceHandover, id)
	}
	if len(v.Staged) > 0 || len(v.Published) > 0 {
		unlock()
		return transfer.Meta{}, nil, nil, fmt.Errorf("%w: volume %s is staged on this node: its pod has not stopped", transfer.ErrBusy, id)
	}
	if v.HandedTo != peer {
		if v.HandedTo != "" {
			unlock()
			return transfer.Meta{}, nil, nil, fmt.Errorf("%w: volume %s is handed over to node %s", transfer.ErrRefused, id, v.HandedTo)
		}
		v.HandedTo = peer
		// Durable before any of it is sent: a start after a crash never
		// stages what another node may already be promoting.
		if err := d.Records.Volumes.Put(v); err != nil {
			unlock()
			return transfer.Meta{}, nil, nil, err
		}
		klog.InfoS("handing a volume over to its standby's node: it is not staged here again", "volume_id", id, "to", peer)
	}
	unlock()
	return d.serveStandby(peer, standbyID)
}

// serveHanded is the new owner's word that it promoted generation g of a
// volume handed to it: this node becomes its standby (demote). Asked again
// once done, it answers the same.
func (d *Engine) serveHanded(peer, standbyID string) (transfer.Meta, error) {
	id, g, _ := parseStandbyID(standbyID)
	if s, ok := d.Records.Standbys.Get(id); ok && s.Primary == peer {
		return transfer.Meta{}, nil
	}
	v, unlock, err := d.lockVolume(id, true)
	if err != nil {
		return transfer.Meta{}, servable(err, SourceHanded, id)
	}
	defer unlock()
	if v.HandedTo != peer {
		return transfer.Meta{}, fmt.Errorf("%w: volume %s was not handed over to node %s", transfer.ErrRefused, id, peer)
	}
	if err := d.demote(v, g); err != nil {
		return transfer.Meta{}, err
	}
	klog.InfoS("a volume handed over is now held by its new owner: this node keeps its standby copy", "volume_id", id, "owner", peer, "generation", g)
	return transfer.Meta{}, nil
}

// demote makes this node the standby of volume v, which it handed over
// and whose new owner promoted generation g: the cut of g it sent becomes
// its generation (the new owner kept the same cut, so the next pull brings
// only what changed since), the copy's record is made, and then the
// volume's data and record go. The caller holds v's lock.
func (d *Engine) demote(v VolumeRecord, g uint64) error {
	dir := standbyDir(d.PoolOf(v.Pool).Paths.Root, v.ID)
	cuts, err := generations(dir, "cut")
	if err != nil {
		return err
	}
	for _, c := range cuts {
		if c == g {
			if err := os.Rename(filepath.Join(dir, cutName(c)), filepath.Join(dir, genName(c))); err != nil {
				return err
			}
		} else if err := os.Remove(filepath.Join(dir, cutName(c))); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	_, every, _ := CheckStandbyParams(v.Parameters)
	s := StandbyRecord{Volume: v.ID, Primary: v.HandedTo, Phase: PhaseReady, Pool: v.Pool, AccessType: v.AccessType, Layout: v.Layout,
		CreatedAt: time.Now().UTC(), IntervalSeconds: int(max(every/time.Second, 1)), PV: v.Name, Epoch: v.Epoch + 1}
	// The copy's record before the volume's data goes: a start in
	// between finds both and finishes (finishPromotions).
	if err := d.Records.Standbys.Put(s); err != nil {
		return err
	}
	return d.removeVolume(v)
}

// reclaim is a stage, on the node that handed volume v over, while the
// new owner has not said it holds it: refused, unless that node is fenced
// (then the volume is this node's again, at an epoch above any the other
// node reached).
func (d *Engine) reclaim(ctx context.Context, v VolumeRecord) error {
	f := d.fences.Load()
	fence := ""
	if f != nil {
		var err error
		if fence, err = (*f)(ctx, v.HandedTo); err != nil {
			return fmt.Errorf("volume %s was handed over to node %s, and whether that node is fenced cannot be told: %w", v.ID, v.HandedTo, err)
		}
	}
	if fence == "" {
		return StorageErr(ErrNotFenced, "volume %s was handed over to node %s (a move), which holds it now; it is staged there, not here, unless node %s is fenced "+
			"(taint it node.kubernetes.io/out-of-service=nodeshutdown:NoExecute, or delete its Node)", v.ID, v.HandedTo, v.HandedTo)
	}
	unlock, err := d.Locks.lock("volume "+v.ID, VolIDKey(v.ID))
	if err != nil {
		return err
	}
	defer unlock()
	cur, ok := d.Records.Volumes.Get(v.ID)
	if !ok || cur.HandedTo == "" {
		return nil
	}
	cur.HandedTo, cur.Epoch = "", cur.Epoch+2
	if err := d.Records.Volumes.Put(cur); err != nil {
		return err
	}
	klog.InfoS("took back a volume handed over to a node that is now fenced", "volume_id", v.ID, "from", v.HandedTo, "fence", fence, "epoch", cur.Epoch)
	return nil
}

// moveHere takes volume id over from its primary, which is up and not
// fenced (see Moves above).
func (d *Engine) moveHere(ctx context.Context, s StandbyRecord) error {
	id := s.Volume
	st, err := d.pullGeneration(ctx, id, SourceHandover)
	if err != nil {
		return StorageErr(ErrNotFenced, "volume %s lives on node %s, which is not fenced and cannot hand it over now (%v); it moves here once node %s has unstaged it "+
			"(its pod has stopped), or is promoted here once node %s is fenced (taint it node.kubernetes.io/out-of-service=nodeshutdown:NoExecute, or delete its Node)",
			id, s.Primary, err, s.Primary, s.Primary)
	}
	v, err := d.PromoteStandby(ctx, id, "handed over by node "+s.Primary)
	if err != nil {
		return err
	}
	// The old owner becomes the standby once told; until then it stages
	// nothing of it, so a notice that does not arrive costs only the copy.
	peers := d.peerSet()
	for try := 0; ; try++ {
		_, _, _, err = peers.Open(ctx, NodeTag(s.Primary), SourceHanded, StandbyID(id, st.Generation), true)
		if err == nil || try == 4 || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Duration(try+1) * 200 * time.Millisecond)
	}
	if err != nil {
		klog.ErrorS(err, "a volume moved here, but its old node was not told; it stays handed over there, serving nothing", "volume_id", id, "old_primary", s.Primary)
	}
	klog.InfoS("moved a volume here from its primary", "volume_id", id, "from", s.Primary, "generation", st.Generation, "bytes", st.Bytes, "epoch", v.Epoch)
	return nil
}
