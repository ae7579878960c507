package csi

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/engine/store"
	"github.com/hostpath-csi/hostpath/fsops"
)

// TopologyKey is the topology segment every volume of this driver carries:
// volumes live on one node.
const TopologyKey = "topology.hostpath.csi/node"

// Config is everything the driver is told at start.
type Config struct {
	DriverName string
	Version    string
	NodeID     string
	StateDir   string
	Endpoint   string

	MaxVolumesPerNode int64
	MaxVolumeSize     int64
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
}

// controllerExpansion and nodeExpansion say which sides of expansion are
// offered.
func (c Config) controllerExpansion() bool {
	return c.EnableVolumeExpansion && !c.DisableControllerExpansion
}

func (c Config) nodeExpansion() bool { return c.EnableVolumeExpansion && !c.DisableNodeExpansion }

// Driver serves the CSI Identity, Controller and Node services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	csi.UnimplementedGroupControllerServer
	csi.UnimplementedSnapshotMetadataServer

	// engine is the storage side: records, pools, locks, placement,
	// reconcile and data. Each handler checks its request and makes one
	// call into it; its errors become gRPC codes at the edge.
	*engine
	metrics *metrics

	mu     sync.Mutex
	socket string // the CSI socket once it listens
	ready  atomic.Bool
}

// layout names the driver's directories under the state dir. Every path the
// driver builds comes from here and a validated id.
type layout struct{ root string }

func (l layout) volumes() string            { return filepath.Join(l.root, "volumes") }
func (l layout) snapshots() string          { return filepath.Join(l.root, "snapshots") }
func (l layout) tmp() string                { return filepath.Join(l.root, "tmp") }
func (l layout) meta() string               { return filepath.Join(l.root, "meta") }
func (l layout) volumeDir(id string) string { return filepath.Join(l.volumes(), id) }
func (l layout) snapshotFile(id string) string {
	return filepath.Join(l.snapshots(), id+".tar.gz")
}

// New checks the configuration, prepares the state dir and loads and
// reconciles the state. The driver is ready when it returns.
func New(cfg Config) (*Driver, error) {
	if cfg.NodeID == "" {
		return nil, fmt.Errorf("a node id is required (--nodeid)")
	}
	if cfg.DriverName == "" {
		return nil, fmt.Errorf("a driver name is required (--drivername)")
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 25 * time.Second
	}
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = 10 * time.Second
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
	cfg.Pools = resolvePools(cfg.Pools)
	if err := checkPools(cfg.Pools, root); err != nil {
		return nil, err
	}
	d := &Driver{engine: &engine{cfg: cfg, paths: layout{root: root}, locks: newKeyLocks(), tag: nodeTag(cfg.NodeID), mountPoint: fsops.GetMountPoint, ops: inflight{ops: map[*operation]struct{}{}}}}
	d.metrics = newMetrics(d)
	d.moved = d.metrics.moved
	d.heavy = make(heavySlots, cfg.MaxHeavyOps)
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
	def := &pool{name: DefaultPool, paths: d.paths}
	def.state.Store(&poolState{quota: detectQuota(d.paths.volumes()), reflink: fsops.ReflinkSupported(d.paths.tmp())})
	klog.InfoS("snapshots of directory volumes", "defaultFormat", map[bool]string{true: formatReflink, false: formatTarGz}[def.get().reflink])
	d.pools = map[string]*pool{DefaultPool: def}
	for name, path := range cfg.Pools {
		p := &pool{name: name, paths: layout{root: path}}
		p.state.Store(&poolState{down: fmt.Errorf("not opened yet")})
		d.pools[name] = p
	}
	if d.st, err = store.Open(d.paths.meta(), store.IDRules{Volume: validVolumeID, Snapshot: validSnapshotID, Group: validGroupID},
		store.Options{JournalSize: cfg.JournalSize}); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", root, err)
	}
	if err := d.reconcile(); err != nil {
		d.st.Close()
		return nil, fmt.Errorf("reconciling state with %s: %w", root, err)
	}
	// A pool that cannot be opened is down, not fatal: the other pools
	// serve, and watchPools brings it up once its disk is back.
	for _, p := range d.poolList()[1:] {
		d.openPool(p)
	}
	if err := d.reattachBlockVolumes(); err != nil {
		d.st.Close()
		return nil, fmt.Errorf("re-attaching block volumes: %w", err)
	}
	if err := d.recordStateFormat(); err != nil {
		d.st.Close()
		return nil, fmt.Errorf("state dir %s: recording its format: %w", root, err)
	}
	if len(cfg.Pools) > 0 {
		d.stopPools = make(chan struct{})
		go d.watchPools(cfg.PoolRetryInterval, d.stopPools)
	}
	d.ready.Store(true)
	return d, nil
}

// Close checkpoints the state's journal and closes it: the next start has
// nothing to redo, and the previous release may start on the state dir.
// Calls after it fail to write state.
func (d *engine) Close() error {
	d.closeOnce.Do(func() {
		if d.stopPools != nil {
			close(d.stopPools)
		}
		// A pull cut here has undone what it made; the provisioner's
		// retry starts it again on the next driver.
		d.bg.stop()
	})
	if err := d.st.Close(); err != nil {
		return err
	}
	return d.lowerDowngradeGuard()
}

// prepareStateDir creates the layout and proves the directory is writable,
// so a read-only or missing state dir stops the driver at start with a
// message naming it rather than failing the first CreateVolume.
func (d *engine) prepareStateDir() error {
	root := d.paths.root
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("state dir %s cannot be created: %w", root, err)
	}
	if err := d.checkStateFormat(); err != nil {
		return err
	}
	if _, err := os.Lstat(d.paths.volumes()); os.IsNotExist(err) {
		d.volumesMade = true
	}
	for _, dir := range []string{d.paths.volumes(), d.paths.snapshots(), d.paths.tmp(), d.paths.meta()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("state dir %s is not usable: %w", root, err)
		}
	}
	if err := probeWritable(d.paths.tmp(), ".start-probe"); err != nil {
		return fmt.Errorf("state dir %s is not writable: %w", root, err)
	}
	if err := d.raiseDowngradeGuard(); err != nil {
		return fmt.Errorf("state dir %s: %w", root, err)
	}
	return nil
}

// probeWritable proves a tmp directory (the state dir's, a pool's) takes a
// durable write, the way the state is written, and removes what it wrote.
func probeWritable(tmp, name string) error {
	probe := filepath.Join(tmp, name)
	if err := fsops.WriteFileAtomic(probe, []byte("ok"), 0o600); err != nil {
		return err
	}
	return os.Remove(probe)
}

// Serve listens on the endpoint (unix://path or a bare path; a stale socket
// is replaced) and serves until ctx is done, then stops gracefully.
func (d *Driver) Serve(ctx context.Context) error {
	path, err := SocketPath(d.cfg.Endpoint)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	d.mu.Lock()
	d.socket = path
	d.mu.Unlock()
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.interceptor), grpc.StreamInterceptor(streamInterceptor))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	csi.RegisterNodeServer(srv, d)
	csi.RegisterGroupControllerServer(srv, d)
	if d.cfg.EnableSnapshotMetadata {
		csi.RegisterSnapshotMetadataServer(srv, d)
	}
	klog.InfoS("serving CSI", "endpoint", path, "driver", d.cfg.DriverName, "version", d.cfg.Version, "node", d.cfg.NodeID, "stateDir", d.paths.root)
	go func() {
		<-ctx.Done()
		// Stop taking calls, let those in flight finish, but not forever:
		// kubelet's grace period is 30 s by default.
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(d.cfg.ShutdownGrace):
			klog.InfoS("calls still running after the grace period; stopping them", "grace", d.cfg.ShutdownGrace)
			srv.Stop()
		}
	}()
	return srv.Serve(lis)
}

// SocketPath accepts unix:///abs, unix://abs, unix:abs or a bare path.
func SocketPath(endpoint string) (string, error) {
	p := endpoint
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	case strings.Contains(p, "://"):
		return "", fmt.Errorf("endpoint %q: only unix sockets are supported (unix:///path or a path)", endpoint)
	}
	if p == "" {
		return "", fmt.Errorf("endpoint %q names no socket path", endpoint)
	}
	return filepath.Abs(p)
}
