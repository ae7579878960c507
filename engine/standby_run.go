package engine

import (
	"context"
	"sync"
	"time"
)

// supersededEvery is how often RunStandbys asks the standbys of the
// volumes this node holds, unstaged, whether they promoted them.
const supersededEvery = 30 * time.Second

// StandbyStatus is what this node knows of a copy it keeps: the newest
// generation it holds and when it was made, and the last pull's outcome.
type StandbyStatus struct {
	Generation uint64
	// Made is when the newest generation was named; zero before the first.
	Made time.Time
	// LastErr is why the last pull failed; nil after a good one.
	LastErr error
	// Bytes is the data received by this node's pulls since it started.
	Bytes int64
}

// standbys is what RunStandbys keeps between pulls (status, due), and
// what a primary knows of its volumes' standbys (served).
type standbys struct {
	mu     sync.Mutex
	status map[string]StandbyStatus
	due    map[string]time.Time
	served map[string]standbyServed
	// pulls are the pulls in flight, by volume: a promotion or a move
	// stops one (takeCopy).
	pulls map[string]context.CancelFunc
}

// copyPulling registers a pull of volume id's copy in flight, under ctx,
// which takeCopy may cancel; done ends it.
func (d *Engine) copyPulling(ctx context.Context, id string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	d.standby.mu.Lock()
	if d.standby.pulls == nil {
		d.standby.pulls = map[string]context.CancelFunc{}
	}
	d.standby.pulls[id] = cancel
	d.standby.mu.Unlock()
	return ctx, func() {
		d.standby.mu.Lock()
		delete(d.standby.pulls, id)
		d.standby.mu.Unlock()
		cancel()
	}
}

// takeCopy takes the lock of the copy this node keeps of volume id for a
// promotion or a move, stopping a regular pull that holds it: the primary
// is fenced (its pull hangs until the transfer gives up on it) or hands
// the volume over. It waits, within ctx, for the pull to let go.
func (d *Engine) takeCopy(ctx context.Context, id string) (func(), error) {
	for {
		unlock, err := d.Locks.lock("the standby copy of volume "+id, standbyKey(id))
		if err == nil {
			return unlock, nil
		}
		d.standby.mu.Lock()
		if cancel := d.standby.pulls[id]; cancel != nil {
			cancel()
		}
		d.standby.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StandbyStatusOf is the status of the copy of volume id this node keeps
// (ok false when it keeps none, or has not pulled since it started).
func (d *Engine) StandbyStatusOf(id string) (StandbyStatus, bool) {
	d.standby.mu.Lock()
	defer d.standby.mu.Unlock()
	s, ok := d.standby.status[id]
	return s, ok
}

// RunStandbys keeps every copy this node keeps caught up until ctx ends:
// each is pulled when nextPull says, one at a time (the node's pulls share
// its bandwidth in turn, and a primary serves one standby per volume).
// pulled, when set, is told each pull's outcome.
func (d *Engine) RunStandbys(ctx context.Context, pulled func(id string, st StandbyState, err error)) {
	d.standby.mu.Lock()
	if d.standby.status == nil {
		d.standby.status, d.standby.due = map[string]StandbyStatus{}, map[string]time.Time{}
	}
	d.standby.mu.Unlock()
	var asked time.Time
	for {
		// A primary back from a fence learns here that its standby
		// promoted its volumes, and becomes their standby.
		if time.Since(asked) >= supersededEvery {
			d.checkSuperseded(ctx)
			asked = time.Now()
		}
		for _, s := range d.Records.Standbys.All() {
			if ctx.Err() != nil {
				return
			}
			now := time.Now()
			d.standby.mu.Lock()
			due := d.standby.due[s.Volume]
			d.standby.mu.Unlock()
			if now.Before(due) {
				continue
			}
			every := time.Duration(max(s.IntervalSeconds, 1)) * time.Second
			st, err := d.CatchUp(ctx, s.Volume)
			d.standby.mu.Lock()
			d.standby.due[s.Volume] = nextPull(now, time.Since(now), every, err)
			cur := d.standby.status[s.Volume]
			cur.LastErr = err
			if err == nil {
				cur.Generation, cur.Made = st.Generation, time.Now()
				cur.Bytes += st.Bytes
			}
			d.standby.status[s.Volume] = cur
			d.standby.mu.Unlock()
			if pulled != nil {
				pulled(s.Volume, st, err)
			}
		}
		wait := time.NewTimer(d.untilNextPull())
		select {
		case <-ctx.Done():
			wait.Stop()
			return
		case <-wait.C:
		}
	}
}

// nextPull is when a copy's next pull is due, after one that began at
// start and took took: every after it began, less what it took, so that
// the newest generation is never older than every when the next one is
// committed (what a failover loses is at most one interval) while pulls
// take less than every; never sooner than a quarter of every after it
// began, so a copy that cannot keep up pulls often but not without pause.
// A pull that failed is tried again a whole interval later.
func nextPull(start time.Time, took, every time.Duration, err error) time.Time {
	if err != nil {
		return start.Add(every)
	}
	return start.Add(max(every-took, every/4))
}

// untilNextPull is how long RunStandbys waits before it looks again: until
// the first pull due, within [10 ms, 1 s] (a copy added meanwhile is due
// at once, and is seen within the second).
func (d *Engine) untilNextPull() time.Duration {
	wait := time.Second
	kept := d.Records.Standbys.All()
	d.standby.mu.Lock()
	defer d.standby.mu.Unlock()
	for _, s := range kept {
		wait = min(wait, time.Until(d.standby.due[s.Volume]))
	}
	return max(wait, 10*time.Millisecond)
}
