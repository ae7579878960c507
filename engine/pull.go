package engine

import (
	"context"
	"fmt"
	"sync"

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

// pullJob is one volume being pulled in the background.
type pullJob struct {
	done chan struct{}
	rec  VolumeRecord
	err  error
}

// background is the work that outlives requests: cancelled and waited
// for by Close, before the state is closed.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	pulls map[string]*pullJob // by volume name
}

func newBackground() *background {
	ctx, cancel := context.WithCancel(context.Background())
	return &background{ctx: ctx, cancel: cancel, pulls: map[string]*pullJob{}}
}

// stop cancels the background work and waits for it to end.
func (b *background) stop() {
	b.cancel()
	b.wg.Wait()
}

// pulling answers a CreateVolume of a name whose pull is in progress.
func (d *Engine) pulling(name string) error {
	d.bg.mu.Lock()
	_, ok := d.bg.pulls[name]
	d.bg.mu.Unlock()
	if !ok {
		return nil
	}
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
	d.bg.mu.Lock()
	d.bg.pulls[rec.Name] = job
	d.bg.mu.Unlock()
	d.bg.wg.Add(1)
	go func() {
		defer d.bg.wg.Done()
		job.rec, job.err = d.provisionVolume(d.bg.ctx, rec, tag)
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
		return job.rec, job.err
	case <-ctx.Done():
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
