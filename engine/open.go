package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/engine/store"
	"github.com/hostpath-csi/hostpath/fsops"
)

// Config is everything the driver is told at start.
type Config struct {
	DriverName string
	Version    string
	NodeID     string
	StateDir   string
	Endpoint   string

	MaxVolumesPerNode int64
	MaxVolumeSize     int64
	// MaxInlineSize caps an inline ephemeral volume: a pod makes one on
	// its own, with no claim for a ResourceQuota to count, so without a
	// cap one pod per node could reserve every pool. Zero: no cap but
	// MaxVolumeSize.
	MaxInlineSize int64
	// PullAbandonAfter is how long a pull from another node goes on with
	// no request asking for its volume; zero means 5 minutes.
	PullAbandonAfter time.Duration
	// Capacity simulates storage pools per StorageClass "kind" parameter,
	// as the reference driver's --capacity does. Empty means real capacity.
	Capacity map[string]int64

	EnableTopology        bool
	EnableVolumeExpansion bool
	// DisableControllerExpansion and DisableNodeExpansion take one side of
	// expansion away (the reference driver's flags). Without the
	// controller side, NodeExpandVolume grows the volume itself.
	DisableControllerExpansion bool
	DisableNodeExpansion       bool
	// MaxVolumeSizeNode bounds the size NodeExpandVolume may grow a volume
	// to; 0 means MaxVolumeSize.
	MaxVolumeSizeNode int64
	// AcceptedMutableParameters, when set, are the only mutable parameter
	// names ControllerModifyVolume and CreateVolume take.
	AcceptedMutableParameters []string
	// SnapshotMetadataFixedLength answers SnapshotMetadata in fixed
	// 4 KiB blocks instead of variable-length ranges.
	SnapshotMetadataFixedLength bool
	// DisableListSnapshots withdraws LIST_SNAPSHOTS.
	DisableListSnapshots bool
	EnableAttach         bool
	EnableModifyVolume   bool
	// EnableSnapshotMetadata serves the SnapshotMetadata service.
	EnableSnapshotMetadata bool

	// CgroupMount is where the host's cgroup file systems are mounted in
	// the driver's container (/sys/fs/cgroup when empty): I/O limits are
	// written into pods' cgroups there.
	CgroupMount string
	// IOLimitInterval is how often the I/O limits are set again in the
	// cgroups of the pods that publish limited volumes (containers made
	// since, on cgroup v1); zero means 2 s.
	IOLimitInterval time.Duration

	// Pools are the storage pools beside the state dir's own (DefaultPool):
	// name to a directory on a file system of its own. A StorageClass or
	// VolumeSnapshotClass chooses one with the parameter "pool".
	Pools map[string]string

	// LocalRoots are the directories static local volumes may come from.
	LocalRoots []string

	// MaxHeavyOps bounds the clones, snapshots and restores that run at
	// once, so a burst cannot exhaust memory or file descriptors; more
	// wait their turn (as long as their caller's deadline allows).
	MaxHeavyOps int

	// ShutdownGrace bounds how long calls in flight may run after SIGTERM.
	ShutdownGrace time.Duration
	// ProgressInterval is how often a snapshot, restore or clone in
	// flight logs its progress (default 10 s).
	ProgressInterval time.Duration
	// PoolRetryInterval is how often a pool that is down is looked at
	// again (default 10 s).
	PoolRetryInterval time.Duration
	// JournalSize is the state journal's length (0: 4 MiB); tests make
	// it small to cross many checkpoints.
	JournalSize int64
	// MaxFreeze bounds how long an image volume's file system stays
	// frozen for a snapshot (0: 10 s). A copy that takes longer (its
	// extents copied on a pool that cannot share blocks) is thawed at the
	// bound and the snapshot refused: pods never wait longer, and no torn
	// copy is kept.
	MaxFreeze time.Duration
	// SnapshotReadyGrace is how long a CreateSnapshot waits, past its
	// snapshot's cut, for the rest (the archive, the checksum) before it
	// is answered not ready and the snapshot made in the background
	// (0: 1 s, which saves the snapshotter a round of polling for a small
	// one). Tests that are not about the background set it long.
	SnapshotReadyGrace time.Duration
	// StandbyBandwidth bounds, in bytes a second, what this node's
	// standby copies pull (one pull at a time, so the node's bound); 0
	// means unbounded.
	StandbyBandwidth int64
	// DefaultLayout is the layout of a new mount volume whose class names
	// none (LayoutDirectory when empty); a restore or clone of a mount
	// source takes its source's instead.
	DefaultLayout string
}

// ControllerExpansion and nodeExpansion say which sides of expansion are
// offered.
func (c Config) ControllerExpansion() bool {
	return c.EnableVolumeExpansion && !c.DisableControllerExpansion
}

// NodeExpansion says whether NodeExpandVolume is offered.
func (c Config) NodeExpansion() bool { return c.EnableVolumeExpansion && !c.DisableNodeExpansion }

// layout names the driver's directories under the state dir. Every path the
// driver builds comes from here and a validated id.
type layout struct{ Root string }

func (l layout) Volumes() string { return filepath.Join(l.Root, "volumes") }

func (l layout) Snapshots() string { return filepath.Join(l.Root, "snapshots") }

func (l layout) Tmp() string { return filepath.Join(l.Root, "tmp") }

func (l layout) Meta() string { return filepath.Join(l.Root, "meta") }

func (l layout) VolumeDir(id string) string { return filepath.Join(l.Volumes(), id) }

func (l layout) snapshotFile(id string) string {
	return filepath.Join(l.Snapshots(), id+".tar.gz")
}

// Close checkpoints the state's journal and closes it: the next start has
// nothing to redo, and the previous release may start on the state dir.
// Calls after it fail to write state.
func (d *Engine) Close() error {
	d.closeOnce.Do(func() {
		// A freeze a request still holds (one cut short by the stop)
		// is thawed before anything else stops.
		d.thawHeld()
		if d.stopPools != nil {
			close(d.stopPools)
		}
		// A pull cut here has undone what it made; the provisioner's
		// retry starts it again on the next driver.
		d.bg.stop()
	})
	// The previous release predates the state format file and knows no
	// image volumes (it would take one for a missing directory): the
	// guard, which it does heed, stays while one exists.
	images := d.holdsImages()
	if err := d.Records.Close(); err != nil {
		return err
	}
	if images {
		return nil
	}
	return d.lowerDowngradeGuard()
}

// prepareStateDir creates the layout and proves the directory is writable,
// so a read-only or missing state dir stops the driver at start with a
// message naming it rather than failing the first CreateVolume.
func (d *Engine) prepareStateDir() error {
	root := d.Paths.Root
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("state dir %s cannot be created: %w", root, err)
	}
	if err := d.checkStateFormat(); err != nil {
		return err
	}
	if _, err := os.Lstat(d.Paths.Volumes()); os.IsNotExist(err) {
		d.volumesMade = true
	}
	for _, dir := range []string{d.Paths.Volumes(), d.Paths.Snapshots(), d.Paths.Tmp(), d.Paths.Meta()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("state dir %s is not usable: %w", root, err)
		}
	}
	if err := ProbeWritable(d.Paths.Tmp(), ".start-probe"); err != nil {
		return fmt.Errorf("state dir %s is not writable: %w", root, err)
	}
	if err := d.raiseDowngradeGuard(); err != nil {
		return fmt.Errorf("state dir %s: %w", root, err)
	}
	return nil
}

// ProbeWritable proves a tmp directory (the state dir's, a pool's) takes a
// durable write, the way the state is written, and removes what it wrote.
func ProbeWritable(tmp, name string) error {
	probe := filepath.Join(tmp, name)
	if err := fsops.WriteFileAtomic(probe, []byte("ok"), 0o600); err != nil {
		return err
	}
	return os.Remove(probe)
}

// Open checks the configuration, prepares the state dir and loads and
// reconciles the state; moved is told the bytes each data operation moves.
func Open(cfg Config, moved func(op string, n int64)) (*Engine, error) {
	if cfg.NodeID == "" {
		return nil, fmt.Errorf("a node id is required (--nodeid)")
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 25 * time.Second
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = 10 * time.Second
	}
	if cfg.MaxFreeze <= 0 {
		cfg.MaxFreeze = 10 * time.Second
	}
	if cfg.SnapshotReadyGrace <= 0 {
		cfg.SnapshotReadyGrace = time.Second
	}
	switch cfg.DefaultLayout {
	case "":
		cfg.DefaultLayout = LayoutDirectory
	case LayoutDirectory, LayoutImage:
	default:
		return nil, fmt.Errorf("--default-layout=%q: want %s or %s", cfg.DefaultLayout, LayoutDirectory, LayoutImage)
	}
	if cfg.PoolRetryInterval <= 0 {
		cfg.PoolRetryInterval = 10 * time.Second
	}
	if cfg.MaxHeavyOps <= 0 {
		cfg.MaxHeavyOps = 4
	}
	if cfg.MaxVolumeSizeNode <= 0 {
		cfg.MaxVolumeSizeNode = cfg.MaxVolumeSize
	}
	// Symlinks resolved once: every check of which file system or
	// directory a path is, is made on what it names.
	root, err := resolvedDir(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("state dir %s: %w", cfg.StateDir, err)
	}
	cfg.StateDir = root
	// First, before anything that can fail: a driver killed mid-snapshot
	// may have left pods' file systems frozen, and a node drain waits on
	// them.
	thawRecorded(root)
	cfg.Pools = resolvePools(cfg.Pools)
	if err := checkPools(cfg.Pools, root); err != nil {
		return nil, err
	}
	d := &Engine{Config: cfg, Paths: layout{Root: root}, Locks: newKeyLocks(), Tag: NodeTag(cfg.NodeID), MountPoint: fsops.GetMountPoint, Ops: inflight{ops: map[*operation]struct{}{}}, moved: moved, started: time.Now()}
	d.Heavy = make(heavySlots, cfg.MaxHeavyOps)
	d.freezes = freezes{held: map[string]*heldFreeze{}, stuck: map[string]error{}}
	d.bg = newBackground()
	if err := d.prepareStateDir(); err != nil {
		return nil, err
	}
	kernel, err := fsops.ProbeKernel(root)
	if err != nil {
		return nil, fmt.Errorf("probing the kernel on %s: %w", root, err)
	}
	if err := kernel.CheckKernel(); err != nil {
		return nil, err
	}
	klog.InfoS("kernel", "release", kernel.Release, "quotactl_fd", kernel.QuotactlFD)
	def := &Pool{Name: DefaultPool, Paths: d.Paths}
	def.state.Store(&PoolState{Quota: detectQuota(d.Paths.Volumes()), Reflink: fsops.ReflinkSupported(d.Paths.Tmp())})
	klog.InfoS("snapshots of directory volumes", "defaultFormat", map[bool]string{true: FormatReflink, false: FormatTarGz}[def.Get().Reflink])
	d.Pools = map[string]*Pool{DefaultPool: def}
	for name, path := range cfg.Pools {
		p := &Pool{Name: name, Paths: layout{Root: path}}
		p.state.Store(&PoolState{Down: fmt.Errorf("not opened yet")})
		d.Pools[name] = p
	}
	if d.Records, err = store.Open(d.Paths.Meta(), store.IDRules{Volume: ValidVolumeID, Snapshot: ValidSnapshotID, Group: ValidGroupID},
		store.Options{JournalSize: cfg.JournalSize}); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", root, err)
	}
	if err := d.reconcile(); err != nil {
		d.Records.Close()
		return nil, fmt.Errorf("reconciling state with %s: %w", root, err)
	}
	// A pool that cannot be opened is down, not fatal: the other pools
	// serve, and watchPools brings it up once its disk is back.
	for _, p := range d.PoolList()[1:] {
		d.OpenPool(p)
	}
	d.finishPromotions()
	if err := d.reattachBlockVolumes(); err != nil {
		d.Records.Close()
		return nil, fmt.Errorf("re-attaching block volumes: %w", err)
	}
	if err := d.recordStateFormat(); err != nil {
		d.Records.Close()
		return nil, fmt.Errorf("state dir %s: recording its format: %w", root, err)
	}
	if len(cfg.Pools) > 0 {
		d.stopPools = make(chan struct{})
		go d.watchPools(cfg.PoolRetryInterval, d.stopPools)
	}
	if cfg.EnableModifyVolume {
		every := cfg.IOLimitInterval
		if every <= 0 {
			every = 2 * time.Second
		}
		d.bg.wg.Add(1)
		go func() {
			defer d.bg.wg.Done()
			d.enforceIOLimits(every, d.bg.ctx.Done())
		}()
	}
	return d, nil
}
