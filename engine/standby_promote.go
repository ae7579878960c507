package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
)

// Promotion (docs/standby.md). When a volume's primary node is fenced, the
// node that keeps its standby copy makes its newest complete generation
// the volume itself, under the same id: the data of the last interval the
// primary cut, no older than its standby's lag. Whether the primary is
// fenced is the caller's to say (Kubernetes' out-of-service taint on its
// Node, or the Node deleted): without a fence a standby never promotes,
// since a primary cut off from it may still be writing.
//
// The promoted volume's record carries the next fencing epoch and names
// the old primary as its standby, and this node keeps the generation's cut
// as the base of that standby's first pull: a primary that comes back
// holds the same cut, so it catches up by changed blocks.
//
// The order makes a crash safe: the volume's record (creating), a reflink
// of the generation as the volume's data and as the cut, each synced, the
// record ready; only then the copy's record and generations go. Cut before
// the ready record, the start takes the half-made volume back and the copy
// stays as it was (dropStandbyCuts leaves a directory a copy's record
// still claims); cut after it, the start finishes the promotion
// (finishPromotions).

// PromoteStandby makes the newest generation of the copy this node keeps
// of volume id the volume, because its primary is fenced (fence says how,
// for the record and the log). It is idempotent: a volume promoted here
// already is returned as it is.
func (d *Engine) PromoteStandby(ctx context.Context, id, fence string) (VolumeRecord, error) {
	if fence == "" {
		return VolumeRecord{}, StorageErr(ErrInvalid, "the standby copy of volume %s is promoted only when its primary is fenced", id)
	}
	unlock, err := d.takeCopy(ctx, id)
	if err != nil {
		return VolumeRecord{}, err
	}
	defer unlock()
	s, ok := d.Records.Standbys.Get(id)
	if !ok {
		if v, ok := d.Records.Volumes.Get(id); ok && v.Phase == PhaseReady {
			return v, nil
		}
		return VolumeRecord{}, StorageErr(ErrNotFound, "this node keeps no copy of volume %s", id)
	}
	g, gen, err := d.StandbyGeneration(id)
	if err != nil {
		return VolumeRecord{}, err
	}
	if g == 0 {
		return VolumeRecord{}, StorageErr(ErrDataMissing, "the copy of volume %s on this node holds no complete generation yet: there is nothing to promote", id)
	}
	fi, err := os.Stat(gen)
	if err != nil {
		return VolumeRecord{}, err
	}
	rec := VolumeRecord{ID: id, Name: s.PV, CapacityBytes: fi.Size(), AccessType: s.AccessType, Pool: s.Pool,
		Parameters: map[string]string{ParamStandby: "1", ParamStandbyInterval: (time.Duration(max(s.IntervalSeconds, 1)) * time.Second).String()},
		Standby:    s.Primary, Epoch: s.Epoch + 1, Phase: PhaseCreating, CreatedAt: time.Now().UTC()}
	if rec.Name == "" {
		rec.Name = id
	}
	if setLayout(&rec, s.Layout) == LayoutImage {
		if rec.FSType, err = copyFS("generation "+fmt.Sprint(g)+" of volume "+id, "cannot be promoted", gen, ""); err != nil {
			return VolumeRecord{}, err
		}
		if err := d.raiseStateFormat(formatImages); err != nil {
			return VolumeRecord{}, err
		}
	}
	release := d.holdPools(rec.Pool)
	defer release()
	if down := d.PoolOf(rec.Pool).Get().Down; down != nil {
		return VolumeRecord{}, fmt.Errorf("the copy of volume %s is in pool %s, which is down: %w", id, d.PoolOf(rec.Pool).Name, down)
	}
	dir := standbyDir(d.PoolOf(rec.Pool).Paths.Root, id)
	promotion := creation[VolumeRecord]{table: d.Records.Volumes, kind: "volume", undo: func(v VolumeRecord) error {
		return d.layoutFor(v).removeData(v)
	}}
	v, err := promotion.create(rec, d.checkCapacity, func(rec VolumeRecord) (VolumeRecord, error) {
		if err := placeCopy(ctx, gen, d.VolumeDataPath(rec)); err != nil {
			return VolumeRecord{}, fmt.Errorf("placing generation %d as volume %s: %w", g, id, err)
		}
		if err := placeCopy(ctx, gen, filepath.Join(dir, cutName(g))); err != nil {
			return VolumeRecord{}, fmt.Errorf("keeping generation %d of volume %s as its standby's base: %w", g, id, err)
		}
		rec.Phase = PhaseReady
		return rec, nil
	})
	if err != nil {
		return VolumeRecord{}, err
	}
	klog.InfoS("promoted the standby copy of a volume: its primary is fenced", "volume_id", id, "generation", g, "old_primary", s.Primary, "fence", fence, "epoch", v.Epoch)
	return v, d.finishPromotion(v)
}

// placeCopy makes dst a copy of src (a reflink where the file system
// shares blocks), durable, under its name only once whole.
func placeCopy(ctx context.Context, src, dst string) error {
	tmp := dst + ".tmp"
	os.Remove(tmp)
	err := copyImage(ctx, src, tmp)
	if err == nil {
		err = fsops.SyncFile(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err == nil {
		err = fsops.SyncDir(filepath.Dir(dst))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// finishPromotion lets go of the copy volume v was promoted from: its
// generations, then its record. v's record is ready and durable.
func (d *Engine) finishPromotion(v VolumeRecord) error {
	s, ok := d.Records.Standbys.Get(v.ID)
	if !ok {
		return nil
	}
	dir := standbyDir(d.PoolOf(s.Pool).Paths.Root, v.ID)
	gens, err := generations(dir, "gen")
	if err != nil {
		return err
	}
	for _, g := range gens {
		if err := os.Remove(filepath.Join(dir, genName(g))); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return d.Records.Standbys.Drop(v.ID)
}

// finishPromotions finishes, at start, the promotions a crash cut after
// their volume's record was ready (the volume at a higher epoch than the
// copy), and the demotions of a move cut after the copy's record was made
// (the volume handed over to the copy's primary).
func (d *Engine) finishPromotions() {
	for _, s := range d.Records.Standbys.All() {
		v, ok := d.Records.Volumes.Get(s.Volume)
		if !ok || v.Phase != PhaseReady {
			continue
		}
		var err error
		switch {
		case v.HandedTo != "" && v.HandedTo == s.Primary:
			err = d.removeVolume(v)
		case v.Epoch > s.Epoch:
			err = d.finishPromotion(v)
		}
		if err != nil {
			klog.ErrorS(err, "finishing the promotion or demotion of a standby copy; the next start tries again", "volume_id", v.ID)
		}
	}
}

// Fences says whether node is fenced: how (for the record and the log),
// or "" when it is not. In a cluster, Kubernetes' out-of-service taint on
// its Node, or its Node deleted.
type Fences func(ctx context.Context, node string) (string, error)

// SetFences lets the standby copies this node keeps be promoted when their
// primary is fenced.
func (d *Engine) SetFences(f Fences) { d.fences.Store(&f) }

// takeOver is what a stage of volume id does first on a node that keeps a
// standby copy of it (a pod of the volume is to run here): it promotes the
// copy if the volume's primary is fenced, and otherwise takes the volume
// over from the primary (moveHere), which hands it over once its pod has
// stopped; a primary it cannot reach or that still has it staged is
// ErrNotFenced, naming the primary and the fences that would let the copy
// be promoted, since a primary cut off from this node may still be
// writing. On the node that handed the volume over it is reclaim. It does
// nothing where this node holds the volume or keeps no copy of it.
func (d *Engine) takeOver(ctx context.Context, id string) error {
	if v, ok := d.Records.Volumes.Get(id); ok && v.Phase == PhaseReady {
		if v.HandedTo != "" {
			return d.reclaim(ctx, v)
		}
		if v.Standby == "" {
			return nil
		}
		superseded, err := d.superseded(ctx, v)
		if errors.Is(err, errNotAsked) {
			klog.InfoS("staging a volume whose standby cannot be asked whether it promoted it", "volume_id", v.ID, "standby", v.Standby, "err", err)
			return nil
		}
		if err != nil || !superseded {
			return err
		}
		// Now this node keeps the copy: the stage moves the volume back.
	}
	s, ok := d.Records.Standbys.Get(id)
	if !ok {
		return nil
	}
	f := d.fences.Load()
	if f == nil {
		return StorageErr(ErrNotFenced, "volume %s lives on node %s; this node keeps its standby copy, but runs outside a cluster, where nothing can fence node %s", id, s.Primary, s.Primary)
	}
	fence, err := (*f)(ctx, s.Primary)
	if err != nil {
		return fmt.Errorf("volume %s lives on node %s, and whether that node is fenced cannot be told: %w", id, s.Primary, err)
	}
	if fence == "" {
		// Up: it hands the volume over once its pod has stopped.
		return d.moveHere(ctx, s)
	}
	_, err = d.PromoteStandby(ctx, id, fence)
	return err
}
