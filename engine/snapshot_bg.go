package engine

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"
)

// A snapshot takes as long as its volume is big (an archive of a large
// directory volume, an image volume's copy on a pool that shares no
// blocks), often longer than the csi-snapshotter's --timeout (a minute by
// default, which deploy/ keeps). Run under the request's deadline it was
// cancelled there and taken back, and its retry started it again from
// nothing, refreezing an image volume each time: a big snapshot was never
// made. So, as a pull from another node, it runs on its own, under the
// driver's lifetime, holding the name's lock and the volume's pin; the
// request waits for it while its deadline allows and otherwise answers
// Aborted (the CSI spec's answer for an operation pending on the name). A
// retry is answered at once, with the bytes done so far, until the
// snapshot is ready, and is then answered with it as any repeated
// CreateSnapshot is. One that fails has taken back what it made, and the
// next retry starts it again. Close cancels it, which takes it back too.

// snapJob is one snapshot being made in the background.
type snapJob struct {
	done chan struct{}
	src  string
	rec  SnapshotRecord
	err  error
}

// snapshotting answers a CreateSnapshot of a name whose snapshot is being
// made past an earlier request: ErrBusy, with its progress, or ErrExists
// for another source volume.
func (d *Engine) snapshotting(name, srcID string) error {
	d.bg.mu.Lock()
	job, ok := d.bg.snaps[name]
	d.bg.mu.Unlock()
	if !ok {
		return nil
	}
	if job.src != srcID {
		return StorageErr(ErrExists, "snapshot %q is being made of volume %s, not of %s", name, job.src, srcID)
	}
	msg := fmt.Sprintf("snapshot %q of volume %s is being made", name, srcID)
	if s, ok := d.Records.Snapshots.ByName(name); ok {
		if b, expected, ok := d.Ops.progressOf(s.ID); ok {
			msg += fmt.Sprintf(" (%s of %s done)", formatBytes(b), formatBytes(expected))
		}
	}
	return StorageErr(ErrBusy, "%s; it is returned once ready, retry later", msg)
}

// snapshotInBackground makes snapshot name of volume srcID in the
// background and takes over release (the name's lock and the volume's
// pin), which it calls when the snapshot is made or given up. It returns
// the snapshot if it is ready within ctx.
func (d *Engine) snapshotInBackground(ctx context.Context, name, srcID string, params map[string]string, release func()) (SnapshotRecord, error) {
	job := &snapJob{done: make(chan struct{}), src: srcID}
	d.bg.mu.Lock()
	d.bg.snaps[name] = job
	d.bg.mu.Unlock()
	d.bg.wg.Add(1)
	go func() {
		defer d.bg.wg.Done()
		job.rec, job.err = d.takeSnapshot(d.bg.ctx, name, srcID, params)
		d.bg.mu.Lock()
		delete(d.bg.snaps, name)
		d.bg.mu.Unlock()
		// The name is free before anyone hears of the end: a retry
		// right after the answer must find the record, not the lock.
		release()
		close(job.done)
	}()
	select {
	case <-job.done:
		return job.rec, job.err
	case <-ctx.Done():
		go func() {
			<-job.done
			if job.err != nil {
				klog.ErrorS(job.err, "a snapshot failed after its request ended; a retry starts it again", "name", name, "source_volume_id", srcID)
			} else {
				klog.InfoS("a snapshot was made after its request ended; a retry returns it", "name", name, "snapshot_id", job.rec.ID)
			}
		}()
		return SnapshotRecord{}, StorageErr(ErrBusy, "snapshot %q of volume %s is being made; it goes on past this request (%v), and a retry returns it once it is ready", name, srcID, ctx.Err())
	}
}
