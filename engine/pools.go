package engine

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
)

// DefaultPool names the state dir's own pool: volumes whose StorageClass
// names no pool go there, and every record written before pools existed is
// in it (its records leave the pool out).
const DefaultPool = "default"

// ParamPool chooses a volume's pool (StorageClass) or a snapshot's
// (VolumeSnapshotClass; by default the source volume's).
const ParamPool = "pool"

// PoolMarker is the file in a pool's directory that names the pool: the
// proof that the directory is the pool's home and not an empty mount
// point whose disk has not arrived.
const PoolMarker = ".hostpath-pool"

var validPoolName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// checkPools checks the --pool names and paths against each other and
// the (absolute) state dir.
func checkPools(pools map[string]string, stateDir string) error {
	for name, path := range pools {
		switch {
		case name == DefaultPool:
			return fmt.Errorf("--pool %s=%s: %q is the state dir's own pool; give this one another name", name, path, DefaultPool)
		case !validPoolName.MatchString(name):
			return fmt.Errorf("--pool %s=%s: a pool name is lower-case letters, digits and dashes (at most 63, as a Kubernetes label value)", name, path)
		case !filepath.IsAbs(path):
			return fmt.Errorf("--pool %s=%s: the path must be absolute", name, path)
		case within(path, stateDir) || within(stateDir, path):
			return fmt.Errorf("--pool %s=%s: a pool may not hold or lie inside the state dir %s", name, path, stateDir)
		}
		for other, op := range pools {
			if other != name && (within(path, op) || within(op, path)) {
				return fmt.Errorf("--pool %s=%s and --pool %s=%s overlap: each pool needs a directory of its own", name, path, other, op)
			}
		}
	}
	return nil
}

// resolvePools returns the pools' paths cleaned and, where they exist,
// with every symlink resolved. A pool whose path is missing keeps it as
// given: it is down until it is there, and its checks follow links.
func resolvePools(pools map[string]string) map[string]string {
	if len(pools) == 0 {
		return pools
	}
	out := make(map[string]string, len(pools))
	for name, path := range pools {
		out[name] = filepath.Clean(path)
		if r, err := filepath.EvalSymlinks(path); err == nil && filepath.IsAbs(path) {
			out[name] = r
		}
	}
	return out
}

// Pool is one directory holding volumes and snapshots (volumes/,
// snapshots/, tmp/), on a file system of its own. Its state changes when a
// pool that was down comes back.
type Pool struct {
	Name  string
	Paths layout
	// mu serialises bringing the pool up; state is read without it.
	mu    sync.Mutex
	state atomic.Pointer[PoolState]
	// ops is held shared by every operation that makes or removes
	// something in the pool (holdPools), for as long as it runs, and
	// exclusively by OpenPool: a pool that went down and comes back is
	// reconciled (its creating records and tmp/ cleared) only once the
	// operations that ran when it went down have ended. OpenPool only
	// ever tries it (TryLock), so no writer ever waits and a shared hold
	// never blocks behind one.
	ops sync.RWMutex
}

// holdPools holds the pools named (record pool names; "" is the default)
// for an operation that makes or removes something in them, until the
// returned function is called: none is reconciled meanwhile. The
// default pool is never reopened, so it needs no hold.
func (d *Engine) holdPools(names ...string) func() {
	var held []*Pool
	for _, n := range names {
		p := d.PoolOf(n)
		if p.Name == DefaultPool || slices.Contains(held, p) {
			continue
		}
		p.ops.RLock()
		held = append(held, p)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for _, p := range held {
				p.ops.RUnlock()
			}
		})
	}
}

// PoolState is what is known of a pool: up with the file system's
// abilities and identity, or down and why.
type PoolState struct {
	Down    error
	Quota   QuotaMode
	Reflink bool
	// dev is the pool's file system; marker the identity of its marker
	// file when it came up. A pool whose marker is no longer that file
	// (its disk went away: an empty mount point, another disk, an I/O
	// error) is taken down at once (recheck).
	dev    uint64
	marker fileID
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// Get is the pool's state as last probed.
func (p *Pool) Get() *PoolState { return p.state.Load() }

// PoolList lists the pools, the default first, then by name.
func (d *Engine) PoolList() []*Pool {
	out := []*Pool{d.Pools[DefaultPool]}
	names := make([]string, 0, len(d.Pools))
	for n := range d.Pools {
		if n != DefaultPool {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		out = append(out, d.Pools[n])
	}
	return out
}

// poolNames lists the pools' names for messages.
func (d *Engine) poolNames() string {
	var names []string
	for _, p := range d.PoolList() {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// PoolOf is the pool a record names ("" is the default). A pool no longer
// configured is a down pool of its own, so its records are kept and
// refused with a message saying so.
func (d *Engine) PoolOf(name string) *Pool {
	if name == "" {
		name = DefaultPool
	}
	if p, ok := d.Pools[name]; ok {
		return p
	}
	p := &Pool{Name: name}
	p.state.Store(&PoolState{Down: fmt.Errorf("pool %q is not configured on this node (--pool %s=PATH)", name, name)})
	return p
}

// ChoosePool reads the pool a request's parameters name; an unknown one is
// InvalidArgument naming the node's pools.
func (d *Engine) ChoosePool(params map[string]string) (*Pool, error) {
	name, ok := params[ParamPool]
	if !ok || name == "" {
		return d.Pools[DefaultPool], nil
	}
	p, ok := d.Pools[name]
	if !ok {
		return nil, StorageErr(ErrInvalid, "parameter %s=%q: this node has the pools %s", ParamPool, name, d.poolNames())
	}
	return p, nil
}

// recordPool is what a record stores for a pool: nothing for the default,
// so state dirs from before pools stay byte for byte the same.
func recordPool(p *Pool) string {
	if p.Name == DefaultPool {
		return ""
	}
	return p.Name
}

// usable answers the state of a pool a request needs. A pool that is down
// is FailedPrecondition naming the path and the cause; watchPools brings
// it up once its disk is back, without a restart. Requests never bring a
// pool up themselves: that repairs the pool's records, which no request
// may be using.
func (d *Engine) usable(p *Pool) (*PoolState, error) {
	st := d.Recheck(p)
	if st.Down != nil {
		return nil, &PoolDownError{Pool: p.Name, Path: p.Paths.Root, Cause: st.Down}
	}
	return st, nil
}

// Recheck returns the state of pool p, first taking it down if it is up
// and its marker is no longer the file it was when it came up: its disk
// went away (unmounted, leaving the bare mount point; replaced; failing).
// One stat: every request that needs the pool makes it, so none writes
// into a mount point whose disk is gone, and none deletes a record whose
// data it cannot reach.
func (d *Engine) Recheck(p *Pool) *PoolState {
	st := p.Get()
	if st.Down != nil || p.Name == DefaultPool {
		return st
	}
	dev, ino, err := fsops.FileID(filepath.Join(p.Paths.Root, PoolMarker))
	if err == nil && (fileID{dev, ino}) == st.marker {
		return st
	}
	if err == nil {
		err = fmt.Errorf("%s is another file than when the pool came up", filepath.Join(p.Paths.Root, PoolMarker))
	}
	down := &PoolState{Down: fmt.Errorf("its disk went away while it was up: %w", err)}
	if p.state.CompareAndSwap(st, down) {
		klog.ErrorS(down.Down, "pool is down: its volumes and snapshots are refused until it is back", "pool", p.Name, "path", p.Paths.Root)
	}
	return p.Get()
}

// watchPools, every interval until stop is closed, takes down the pools
// whose disk went away and tries to bring up the pools that are down.
func (d *Engine) watchPools(every time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for _, p := range d.PoolList()[1:] {
			if d.Recheck(p).Down != nil {
				d.OpenPool(p)
			}
		}
	}
}

// OpenPool brings a pool other than the default up, or records why it is
// down. Its directory must be the pool's (preparePool): the marker names
// it, or, the first time the state dir sees the pool, it is marked. Once
// up, what start does for the state dir is done
// for the pool: unfinished work cleared, interrupted operations finished,
// block volumes attached.
func (d *Engine) OpenPool(p *Pool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.Get().Down == nil {
		return
	}
	// Reconciling clears what operations in flight are making: it waits
	// for them (the next round tries again).
	if !p.ops.TryLock() {
		klog.V(2).InfoS("pool stays down until the operations that ran when it went down end", "pool", p.Name)
		return
	}
	defer p.ops.Unlock()
	st, err := d.preparePool(p)
	if err == nil {
		err = d.reconcilePool(p)
	}
	if err != nil {
		if prev := p.Get().Down; prev == nil || prev.Error() != err.Error() {
			klog.ErrorS(err, "pool is down: its volumes and snapshots are refused until it is back", "pool", p.Name, "path", p.Paths.Root)
		}
		p.state.Store(&PoolState{Down: err})
		return
	}
	p.state.Store(st)
	klog.InfoS("pool is up", "pool", p.Name, "path", p.Paths.Root, "quota", st.Quota.String(), "reflink", st.Reflink)
	if err := d.reattachBlockVolumes(); err != nil {
		klog.ErrorS(err, "re-attaching the pool's block volumes; each is attached on publish", "pool", p.Name)
	}
}

// poolHasRecords reports whether any record is in pool name.
func (d *Engine) poolHasRecords(name string) bool {
	for _, v := range d.Records.Volumes.All() {
		if v.Pool == name {
			return true
		}
	}
	for _, s := range d.Records.Snapshots.All() {
		if s.Pool == name {
			return true
		}
	}
	return false
}

// tmpBeside is the tmp directory of the pool a volume or snapshot path
// (<pool>/volumes/<id>... or <pool>/snapshots/<id>...) is in: partial
// files are renamed into place, so they are made on the same file system.
func tmpBeside(path string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(path)), "tmp")
}
