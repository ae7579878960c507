package engine

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// A snapshot takes as long as its volume is big (an archive of a large
// directory volume, the checksum of a large image), often longer than the
// csi-snapshotter's --timeout (a minute by default, which deploy/ keeps),
// and one central snapshotter calls CreateSnapshot for every node: run
// under the request, ten big snapshots on one node held every worker and
// stalled snapshots cluster-wide, and one cancelled at its deadline was
// started again from nothing by its retry. So, as a pull from another
// node, a snapshot runs on its own, under the driver's lifetime, holding
// the name's lock and the volume's pin, and the request is answered as
// soon as the snapshot's instant is fixed (its cut: the freeze and copy of
// an image volume, the start of a directory volume's archive): with the
// snapshot, ready_to_use false unless it is done within
// Config.SnapshotReadyGrace (a second: a small snapshot is then answered
// ready at once, saving the snapshotter a round of polling). The
// snapshotter asks again (CreateSnapshot with the same name, or
// ListSnapshots by id) until it is ready. Before its cut (waiting for a
// slot, or a copy under freeze longer than the request), the request
// answers Aborted, the CSI spec's answer for an operation pending on the
// name, and a retry is answered at once. One that fails has taken back
// what it made, and the next retry of its name is answered its error (the
// snapshotter shows it on the VolumeSnapshotContent, as it would for one
// that failed under its request); the retry after starts it again.
// DeleteSnapshot of one being made stops it, and Close stops them all,
// which takes them back.

// failedSnap is how a snapshot made past its request failed.
type failedSnap struct {
	src string
	err error
}

// snapJob is one snapshot being made in the background.
type snapJob struct {
	done   chan struct{}
	cut    chan struct{} // closed once pending holds the cut snapshot
	cancel context.CancelFunc
	src    string
	// pending is the snapshot as cut: its id and instant, not ready.
	pending SnapshotRecord
	// answered says how its request was answered before it was made
	// ("" while none was): the end is then logged, since nobody waits.
	answered string
	rec      SnapshotRecord
	err      error
}

// snapshotting answers a CreateSnapshot of a name whose snapshot is being
// made past an earlier request: the snapshot, not ready, once it is cut;
// before, ErrBusy with its progress; ErrExists for another source volume.
// ok is false when no such snapshot is being made.
// A snapshot of the name and volume that failed past its request is
// answered its error, once.
func (d *Engine) snapshotting(name, srcID string) (rec SnapshotRecord, ok bool, err error) {
	d.bg.mu.Lock()
	job, ok := d.bg.snaps[name]
	failed, heard := d.bg.failed[name]
	heard = heard && !ok && failed.src == srcID
	if heard {
		delete(d.bg.failed, name)
	}
	d.bg.mu.Unlock()
	if heard {
		return SnapshotRecord{}, true, fmt.Errorf("snapshot %q failed after its request was answered, and a retry starts it again: %w", name, failed.err)
	}
	if !ok {
		return SnapshotRecord{}, false, nil
	}
	if job.src != srcID {
		return SnapshotRecord{}, true, StorageErr(ErrExists, "snapshot %q is being made of volume %s, not of %s", name, job.src, srcID)
	}
	select {
	case <-job.cut:
		return job.pending, true, nil
	default:
	}
	msg := fmt.Sprintf("snapshot %q of volume %s is being made", name, srcID)
	if s, ok := d.Records.Snapshots.ByName(name); ok {
		if b, expected, ok := d.Ops.progressOf(s.ID); ok {
			msg += fmt.Sprintf(" (%s of %s done)", formatBytes(b), formatBytes(expected))
		}
	}
	return SnapshotRecord{}, true, StorageErr(ErrBusy, "%s; it is returned once it is cut, retry later", msg)
}

// BeingMade returns the snapshot with this id if it is cut and being made
// in the background (not ready yet): what ListSnapshots and GetSnapshot
// report for it.
func (d *Engine) BeingMade(id string) (SnapshotRecord, bool) {
	if job := d.snapJobOf(id); job != nil {
		return job.pending, true
	}
	return SnapshotRecord{}, false
}

// snapJobOf is the background job making the cut snapshot with this id,
// or nil.
func (d *Engine) snapJobOf(id string) *snapJob {
	d.bg.mu.Lock()
	defer d.bg.mu.Unlock()
	for _, job := range d.bg.snaps {
		select {
		case <-job.cut:
			if job.pending.ID == id {
				return job
			}
		default:
		}
	}
	return nil
}

// stopSnapshot stops the snapshot with this id if it is being made (the
// CO deletes a snapshot it was answered not ready for) and waits until it
// has ended: taken back, or made if it was done first.
func (d *Engine) stopSnapshot(ctx context.Context, id string) error {
	job := d.snapJobOf(id)
	if job == nil {
		return nil
	}
	job.cancel()
	select {
	case <-job.done:
		return nil
	case <-ctx.Done():
		return StorageErr(ErrBusy, "snapshot %s is being stopped: %v", id, ctx.Err())
	}
}

// awaitSnapshot waits, within ctx, until the snapshot with this id is no
// longer being made: a restore from one answered not ready waits for it.
func (d *Engine) awaitSnapshot(ctx context.Context, id string) error {
	job := d.snapJobOf(id)
	if job == nil {
		return nil
	}
	select {
	case <-job.done:
		return nil
	case <-ctx.Done():
		return StorageErr(ErrBusy, "snapshot %s is still being made (%v); retry once it is ready", id, ctx.Err())
	}
}

// snapshotInBackground makes snapshot name of volume srcID in the
// background and takes over release (the name's lock and the volume's
// pin), which it calls when the snapshot is made or given up. It returns
// the snapshot once it is cut (ready if it was done within the grace),
// or ErrBusy if ctx ends before the cut.
func (d *Engine) snapshotInBackground(ctx context.Context, name, srcID string, params map[string]string, release func()) (SnapshotRecord, error) {
	jobCtx, cancel := context.WithCancel(d.bg.ctx)
	job := &snapJob{done: make(chan struct{}), cut: make(chan struct{}), cancel: cancel, src: srcID}
	d.bg.mu.Lock()
	d.bg.snaps[name] = job
	d.bg.mu.Unlock()
	d.bg.wg.Add(1)
	go func() {
		defer d.bg.wg.Done()
		defer cancel()
		job.rec, job.err = d.takeSnapshot(jobCtx, name, srcID, params, func(s SnapshotRecord) {
			d.bg.mu.Lock()
			job.pending = s
			close(job.cut)
			d.bg.mu.Unlock()
		})
		d.bg.mu.Lock()
		delete(d.bg.snaps, name)
		how := job.answered
		if how != "" && job.err != nil && jobCtx.Err() == nil {
			d.bg.failed[name] = failedSnap{src: srcID, err: job.err}
		}
		d.bg.mu.Unlock()
		// The name is free before anyone hears of the end: a retry
		// right after the answer must find the record, not the lock.
		release()
		close(job.done)
		switch {
		case how == "":
		case job.err != nil:
			klog.ErrorS(job.err, "a snapshot failed after its request was answered; the next retry is answered this, the one after starts it again", "name", name, "source_volume_id", srcID, "answered", how)
		default:
			klog.InfoS("a snapshot was made after its request was answered", "name", name, "snapshot_id", job.rec.ID, "answered", how)
		}
	}()
	answered := func(how string) {
		d.bg.mu.Lock()
		job.answered = how
		d.bg.mu.Unlock()
	}
	select {
	case <-job.done:
		return job.rec, job.err
	case <-job.cut:
		grace := time.NewTimer(d.Config.SnapshotReadyGrace)
		defer grace.Stop()
		select {
		case <-job.done:
			return job.rec, job.err
		case <-grace.C:
		case <-ctx.Done():
		}
		answered("not ready")
		return job.pending, nil
	case <-ctx.Done():
		answered("Aborted")
		return SnapshotRecord{}, StorageErr(ErrBusy, "snapshot %q of volume %s is being made; it goes on past this request (%v), and a retry returns it once it is cut", name, srcID, ctx.Err())
	}
}
