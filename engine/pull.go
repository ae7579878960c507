package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// A volume pulled from another node takes as long as its source is big,
// often longer than the provisioner's --timeout: run under the request's
// deadline it would be cancelled at that deadline, and its retry would
// start again from nothing, so a big restore might never finish. So the
// pull runs on its own, under the driver's lifetime, holding the name's
// lock; the request waits for it while its deadline allows and otherwise
// answers Aborted, that the volume is being made (the CSI spec's answer
// for an operation pending on the name). A retry is told the same, with
// the bytes moved so far, until the volume is ready, and is then answered
// with it as any repeated CreateVolume is. A pull that fails has undone
// what it made, and the next retry starts it again.
//
// A pull nobody asks about any more (its claim deleted, the provisioner
// gone) is cancelled after Config.PullAbandonAfter without a request for
// its name: otherwise a source of terabytes (a sparse file another tar
// wrote, whose holes are read as zeros) would hold the name and a slot
// until it ended.

// pullJob is one volume being pulled in the background.
type pullJob struct {
	done chan struct{}
	rec  VolumeRecord
	err  error
	// asked is when a request last asked for the volume (unix nanos);
	// waiting counts the requests waiting for it now.
	asked   atomic.Int64
	waiting atomic.Int32
}

// defaultPullAbandonAfter is how long a pull runs with nobody asking.
const defaultPullAbandonAfter = 5 * time.Minute

// errAbandoned is why an abandoned pull's context ends.
var errAbandoned = errors.New("nobody asked for the volume for a while: the pull was abandoned")

// background is the work that outlives requests: cancelled and waited
// for by Close, before the state is closed.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	pulls map[string]*pullJob // by volume name
	snaps map[string]*snapJob // by snapshot name
	// failed holds, by snapshot name, how a snapshot answered not ready
	// (or Aborted) failed afterwards, until a retry of that name hears it.
	failed map[string]failedSnap
}

func newBackground() *background {
	ctx, cancel := context.WithCancel(context.Background())
	return &background{ctx: ctx, cancel: cancel, pulls: map[string]*pullJob{}, snaps: map[string]*snapJob{}, failed: map[string]failedSnap{}}
}

// stop cancels the background work and waits for it to end.
func (b *background) stop() {
	b.cancel()
	b.wg.Wait()
}

// pulling answers a CreateVolume of a name whose pull is in progress.
func (d *Engine) pulling(name string) error {
	d.bg.mu.Lock()
	job, ok := d.bg.pulls[name]
	d.bg.mu.Unlock()
	if !ok {
		return nil
	}
	job.asked.Store(time.Now().UnixNano())
	msg := fmt.Sprintf("volume %q is being pulled from another node", name)
	if v, ok := d.Records.Volumes.ByName(name); ok {
		if b, expected, ok := d.Ops.progressOf(v.ID); ok {
			msg += fmt.Sprintf(" (%s of %s moved)", formatBytes(b), formatBytes(expected))
		}
	}
	return StorageErr(ErrBusy, "%s; it is returned once ready, retry later", msg)
}

// provisionPulled provisions rec, whose source is on another node, in the
// background, and takes over unlock (the name's lock), which it releases
// when the pull ends. It returns the volume if it is ready within ctx.
func (d *Engine) provisionPulled(ctx context.Context, rec VolumeRecord, tag string, unlock func()) (VolumeRecord, error) {
	job := &pullJob{done: make(chan struct{})}
	job.asked.Store(time.Now().UnixNano())
	job.waiting.Add(1)
	d.bg.mu.Lock()
	d.bg.pulls[rec.Name] = job
	d.bg.mu.Unlock()
	jobCtx, abandon := context.WithCancelCause(d.bg.ctx)
	d.bg.wg.Add(2)
	go func() {
		defer d.bg.wg.Done()
		d.watchPull(job, abandon, rec.Name)
	}()
	go func() {
		defer d.bg.wg.Done()
		defer abandon(nil)
		job.rec, job.err = d.provisionVolume(jobCtx, rec, tag)
		if cause := context.Cause(jobCtx); errors.Is(cause, errAbandoned) && job.err != nil {
			job.err = StorageErr(ErrBusy, "volume %q: %v after %s; a retry starts it again", rec.Name, errAbandoned, d.pullAbandonAfter())
		}
		d.bg.mu.Lock()
		delete(d.bg.pulls, rec.Name)
		d.bg.mu.Unlock()
		// The name is free before anyone hears of the end: a retry
		// right after the answer must not find it still held.
		unlock()
		close(job.done)
	}()
	select {
	case <-job.done:
		job.waiting.Add(-1)
		return job.rec, job.err
	case <-ctx.Done():
		job.asked.Store(time.Now().UnixNano())
		job.waiting.Add(-1)
		go func() {
			<-job.done
			if job.err != nil {
				klog.ErrorS(job.err, "pulling a volume from another node failed after its request ended; a retry starts it again", "name", rec.Name)
			} else {
				klog.InfoS("pulled a volume from another node after its request ended; a retry returns it", "name", rec.Name, "volume_id", job.rec.ID)
			}
		}()
		return VolumeRecord{}, StorageErr(ErrBusy, "volume %q is being pulled from another node; the pull goes on past this request (%v), and a retry returns the volume once it is ready", rec.Name, ctx.Err())
	}
}

func (d *Engine) pullAbandonAfter() time.Duration {
	if d.Config.PullAbandonAfter > 0 {
		return d.Config.PullAbandonAfter
	}
	return defaultPullAbandonAfter
}

// watchPull abandons job once nobody has asked for it for
// pullAbandonAfter, and ends with it.
func (d *Engine) watchPull(job *pullJob, abandon context.CancelCauseFunc, name string) {
	after := d.pullAbandonAfter()
	t := time.NewTicker(max(after/8, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-job.done:
			return
		case <-t.C:
			idle := time.Since(time.Unix(0, job.asked.Load()))
			if job.waiting.Load() == 0 && idle > after {
				klog.InfoS("abandoning a pull from another node: nobody asked for the volume", "name", name, "idle", idle.Round(time.Second))
				abandon(errAbandoned)
				return
			}
		}
	}
}
