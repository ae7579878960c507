package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hostpath-csi/hostpath/fsops"
)

// A pool's directory is the pool's home only with its marker: without it,
// an empty mount point whose disk is late would take the pool's volumes on
// the root disk. The driver marks a pool by itself once, the first time it
// sees the directory on a file system of its own, with no record anywhere
// that might name the pool; it remembers, durably in the state dir
// (meta/pools/<name>), every pool it ever marked or found marked, and never
// marks that name again. A new disk for a known pool is marked by a
// person: hostpathplugin --mark-pool=NAME (MarkPool).

// KnownPools is the state dir's memory of the pools ever marked.
func (l layout) KnownPools() string { return filepath.Join(l.Meta(), "pools") }

// knownPool says when pool name was first marked, if ever.
func (d *Engine) knownPool(name string) (string, bool, error) {
	b, err := os.ReadFile(filepath.Join(d.Paths.KnownPools(), name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return strings.TrimSpace(string(b)), true, nil
}

// rememberPool records, durably, that pool name is marked at path.
func rememberPool(l layout, name, path string) error {
	if err := os.MkdirAll(l.KnownPools(), 0o700); err != nil {
		return err
	}
	if err := fsops.SyncDir(l.Meta()); err != nil {
		return err
	}
	note := fmt.Sprintf("marked at %s on %s\n", path, time.Now().UTC().Format(time.RFC3339))
	return fsops.WriteFileAtomic(filepath.Join(l.KnownPools(), name), []byte(note), 0o600)
}

// readMarker returns the pool name marker at root says, and whether it is
// there.
func readMarker(root string) (string, bool, error) {
	b, err := os.ReadFile(filepath.Join(root, PoolMarker))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return strings.TrimSpace(string(b)), true, nil
}

// writeMarker makes root pool name's home: the layout, then the marker
// (its write fsyncs the pool's directory, and with it these entries, so a
// marked pool never comes back from a power loss without its volumes
// directory), then the state dir's memory of it.
func writeMarker(l layout, root, name string) error {
	pl := layout{Root: root}
	for _, dir := range []string{pl.Volumes(), pl.Snapshots(), pl.Tmp()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := fsops.WriteFileAtomic(filepath.Join(root, PoolMarker), []byte(name+"\n"), 0o644); err != nil {
		return fmt.Errorf("marking %s as pool %s: %w", root, name, err)
	}
	return rememberPool(l, name, root)
}

// ownFileSystem checks that root, on file system dev, is on a file system
// of its own: not the state dir's (an empty mount point of a late disk is)
// and not one of others' (pool name to its root and device: two pools on
// one file system would both count its free space).
func ownFileSystem(root string, dev uint64, stateDir string, others map[string]poolDev) error {
	sdev, _, err := fsops.FileID(stateDir)
	if err != nil {
		return err
	}
	if dev == sdev {
		return fmt.Errorf("%s is on the state dir's file system: a pool is a file system of its own (is its disk mounted?)", root)
	}
	for name, o := range others {
		if o.dev == dev {
			return fmt.Errorf("%s is on the file system of pool %s (%s): each pool needs a file system of its own, or both would report its free space", root, name, o.root)
		}
	}
	return nil
}

// poolDev is where another pool is.
type poolDev struct {
	root string
	dev  uint64
}

// otherPoolsUp are the pools other than p that are up, and where.
func (d *Engine) otherPoolsUp(p *Pool) map[string]poolDev {
	out := map[string]poolDev{}
	for _, q := range d.PoolList()[1:] {
		if st := q.Get(); q != p && st.Down == nil {
			out[q.Name] = poolDev{q.Paths.Root, st.dev}
		}
	}
	return out
}

// preparePool checks that a pool's directory is its home and makes it
// ready: the marker names it, or, the first time, it is marked.
func (d *Engine) preparePool(p *Pool) (*PoolState, error) {
	root := p.Paths.Root
	fi, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("its directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", root)
	}
	dev, _, err := fsops.FileID(root)
	if err != nil {
		return nil, err
	}
	if err := ownFileSystem(root, dev, d.Paths.Root, d.otherPoolsUp(p)); err != nil {
		return nil, err
	}
	marker := filepath.Join(root, PoolMarker)
	name, marked, err := readMarker(root)
	if err != nil {
		return nil, err
	}
	since, known, err := d.knownPool(p.Name)
	if err != nil {
		return nil, err
	}
	switch {
	case marked && name != p.Name:
		return nil, fmt.Errorf("%s says this directory is pool %q, not %q: fix --pool", marker, name, p.Name)
	case marked && !known:
		// Marked by a release that did not remember its pools.
		if err := rememberPool(d.Paths, p.Name, root); err != nil {
			return nil, err
		}
	case !marked && known:
		return nil, fmt.Errorf("%s is missing, and this pool was %s: is its disk mounted? A new disk for it is marked with hostpathplugin --mark-pool=%s", marker, since, p.Name)
	case !marked && d.poolHasRecords(p.Name):
		return nil, fmt.Errorf("%s is missing, yet volumes or snapshots are recorded in this pool: is its disk mounted?", marker)
	case !marked && len(d.Records.Damaged()) > 0:
		return nil, fmt.Errorf("%s is missing, and %d damaged records may name this pool: it is not marked by itself; once its disk is known to be mounted, mark it with hostpathplugin --mark-pool=%s", marker, len(d.Records.Damaged()), p.Name)
	case !marked:
		if err := writeMarker(d.Paths, root, p.Name); err != nil {
			return nil, err
		}
	}
	for _, dir := range []string{p.Paths.Volumes(), p.Paths.Snapshots(), p.Paths.Tmp()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	if err := ProbeWritable(p.Paths.Tmp(), ".write-probe"); err != nil {
		return nil, fmt.Errorf("not writable: %w", err)
	}
	mdev, mino, err := fsops.FileID(marker)
	if err != nil {
		return nil, err
	}
	return &PoolState{Quota: detectQuota(p.Paths.Volumes()), Reflink: fsops.ReflinkSupported(p.Paths.Tmp()),
		dev: dev, marker: fileID{mdev, mino}}, nil
}

// MarkPool marks the directory of pool name (cfg.Pools) as that pool's
// home, for a new disk of a pool the state dir already knows, which the
// driver never marks by itself. The directory must be on a file system of
// its own and carry no marker of another pool. A running driver brings
// the pool up at its next look (Config.PoolRetryInterval). It says what
// it did, or why it refused.
func MarkPool(cfg Config, name string) (string, error) {
	path, ok := cfg.Pools[name]
	if !ok {
		return "", fmt.Errorf("--mark-pool=%s: no --pool %s=PATH given", name, name)
	}
	state, err := resolvedDir(cfg.StateDir)
	if err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("pool %s: %w", name, err)
	}
	if err := checkPools(map[string]string{name: root}, state); err != nil {
		return "", err
	}
	// The other pools marked as theirs: a new disk must not be one.
	others := map[string]poolDev{}
	for other, op := range cfg.Pools {
		if n, marked, _ := readMarker(op); other != name && marked && n == other {
			if dev, _, err := fsops.FileID(op); err == nil {
				others[other] = poolDev{op, dev}
			}
		}
	}
	dev, _, err := fsops.FileID(root)
	if err != nil {
		return "", err
	}
	if err := ownFileSystem(root, dev, state, others); err != nil {
		return "", err
	}
	got, marked, err := readMarker(root)
	if err != nil {
		return "", err
	}
	if marked && got != name {
		return "", fmt.Errorf("%s is marked as pool %q: it is not pool %s's disk", root, got, name)
	}
	held := 0
	for _, dir := range []string{layout{Root: root}.Volumes(), layout{Root: root}.Snapshots()} {
		entries, _ := os.ReadDir(dir)
		held += len(entries)
	}
	if err := writeMarker(layout{Root: state}, root, name); err != nil {
		return "", err
	}
	msg := fmt.Sprintf("%s is marked as pool %s", root, name)
	if held > 0 {
		msg += fmt.Sprintf(" (it holds %d volumes and snapshots already: a driver serves those that records name and reports the rest as unowned)", held)
	}
	return msg, nil
}

// resolvedDir makes dir if it is missing and returns its absolute path
// with every symlink resolved: every check of identity (which file system,
// which directory) is made on what the path names, once at start.
func resolvedDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("%s cannot be created: %w", abs, err)
	}
	return filepath.EvalSymlinks(abs)
}
