package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hostpath-csi/hostpath/engine/store"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/iolimit"
)

// Engine is the storage side of the driver: it owns the records, the
// pools, the locks, placement, reconcile and every byte of volume and
// snapshot data, and answers in its own errors (storage_errors.go). It
// calls nothing of the CSI protocol; the protocol (csi.Driver) calls it,
// one call per request.
type Engine struct {
	// Config is what the engine was opened with, its defaults filled in
	// and its directories resolved.
	Config Config
	Paths  layout // the state dir: meta/, and the default pool's directories
	// Pools are the default pool (the state dir) and the --pool ones,
	// fixed at start; each one's state changes as it goes down or up.
	Pools map[string]*Pool
	// Records are the state. The protocol side reads them (listings,
	// health); only the engine's methods change them.
	Records *store.Store
	// Locks are the per-name and per-id locks every change takes.
	Locks *keyLocks
	Tag   string // this node's id prefix
	// volumesMade: this start made the volumes directory, so it is the
	// home of the volumes (not an empty mount point of a late disk).
	volumesMade bool
	// Unowned counts the entries start found under a volume or snapshot
	// id that no record owns, kept and reported by health.
	Unowned atomic.Int64
	Ops     inflight   // snapshots, restores and clones running now
	Heavy   heavySlots // MaxHeavyOps slots for clones, snapshots, restores, sends
	// peers reaches the other nodes' drivers for sources they hold
	// (SetPeers); nil when there are none to reach.
	peers atomic.Pointer[Peers]
	// standbyNodes lists the nodes a standby copy may be kept on
	// (SetStandbyNodes); nil outside a cluster.
	standbyNodes atomic.Pointer[StandbyNodes]
	// fences says whether a node is fenced (SetFences); nil outside a
	// cluster, where no standby is ever promoted.
	fences atomic.Pointer[Fences]
	// standby is what RunStandbys keeps of the copies this node keeps,
	// and what this node knows of its volumes' standbys.
	standby standbys
	// started is when Open made the engine.
	started time.Time

	// formatMu orders the writes of the state format; format is the one
	// recorded (format.go).
	formatMu sync.Mutex
	format   int

	// attachMu makes counting a node's attachments and adding one a
	// single step, so two publishes of different volumes (each under its
	// own volume lock) cannot both take the last slot.
	attachMu sync.Mutex
	// bindMu makes finding a volume's writable loop device and binding
	// one if there is none a single step (attachImage, attachBlock).
	bindMu sync.Mutex

	// mountPoint inspects a path's mount (fsops.GetMountPoint); tests
	// replace it to make inspection fail.
	MountPoint func(path string) (*fsops.MountPoint, error)

	// freezes are the image volumes' file systems frozen now (freeze.go).
	freezes freezes
	// notifier, when set, is told what the driver could not do for a
	// volume that no call's error carries (SetNotifier).
	notifier atomic.Pointer[Notifier]
	// notGrown holds, by volume id, why an image volume's file system
	// could not grow to its device; grownAt the device size at which a
	// growth added nothing (growImage).
	notGrown, grownAt sync.Map

	// bg is the work that outlives requests (pulls from other nodes),
	// stopped by Close before the state is.
	bg *background

	// cg is the host's cgroup hierarchy for I/O limits; ioMu orders the
	// writes of limits (a modify's, a publish's, the enforcer's), so none
	// puts back what another has just replaced.
	cg   cgroups
	ioMu sync.Mutex
	// lifted are the volumes whose write limits a freeze has lifted
	// (liftWriteLimits), guarded by ioMu.
	lifted map[string]bool
	// cgWatch watches the cgroups of pods with limited volumes for new
	// containers (set by enforceIOLimits).
	cgWatch atomic.Pointer[iolimit.Watcher]

	// stopPools ends watchPools (Close).
	stopPools chan struct{}
	closeOnce sync.Once

	// moved counts the bytes the data path moved, by operation (the
	// protocol side's metrics).
	moved func(op string, n int64)
}

// Notifier is told, by volume name (the CO's: a PersistentVolume's), what
// the driver could not do for a volume that no call's error carries; it
// must not block. cmd makes it a Warning event on the PersistentVolume.
type Notifier func(volumeName, reason, message string)

// SetNotifier sets where the engine's notes about volumes go (nil: only
// the log).
func (d *Engine) SetNotifier(n Notifier) {
	if n == nil {
		d.notifier.Store(nil)
		return
	}
	d.notifier.Store(&n)
}

// notify passes a note about volume v to the notifier, if one is set.
func (d *Engine) notify(v VolumeRecord, reason, message string) {
	if n := d.notifier.Load(); n != nil && v.Name != "" {
		(*n)(v.Name, reason, message)
	}
}
