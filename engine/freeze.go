package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/loop"
)

// The freeze path. A snapshot, clone or send of a mounted image volume
// freezes its file system (FIFREEZE), copies its image, and thaws it. A
// freeze is the kernel's, not the process's: a driver killed in between
// leaves the pods' writes hung until someone thaws it. So each freeze the
// driver makes is recorded (freezes/<volume id>.<freeze>.json in the state
// dir, durable) before FIFREEZE, and removed once thawed; the next start
// thaws exactly those, first, from mountinfo and the loop devices' backing
// files alone, before anything that can fail. Records are named by freeze,
// not by volume: a freeze whose thaw failed keeps its record (and its held
// descriptor) while later freezes of the same volume come and go. A file
// system someone else froze (a backup tool's fsfreeze hook) is copied as
// it is and left frozen, at the snapshot and at start: thawing it is the
// hook's to do; it is checked again after the copy, and a hook that thawed
// meanwhile makes the copy refused.

// frozenKey is the context key of the volumes a caller holds under their
// freeze lock (a group's): frozen by it, or found unmounted.
type frozenKey struct{}

// freezeRecord is what the state dir keeps of a freeze in progress.
type freezeRecord struct {
	Volume string `json:"volume"`
	// Image is the image file whose loop device's file system is frozen.
	Image string `json:"image"`
	// Dev is that loop device (st_dev of the mounted file system), Path
	// the mount it was frozen through.
	Dev  uint64 `json:"dev"`
	Path string `json:"path"`
}

// freezeDir is where freezes in progress are recorded.
func freezeDir(root string) string { return filepath.Join(root, "freezes") }

// freezes are this driver's freezes in progress, by freeze key: what
// Close thaws, and what health reports of a thaw that failed.
type freezes struct {
	mu    sync.Mutex
	held  map[string]*heldFreeze
	stuck map[string]error
	// seq makes freeze keys unique within this process; the start time
	// in them, across restarts (a record a previous one left).
	seq atomic.Uint64
}

// newKey names a freeze of volume id.
func (f *freezes) newKey(id string) string {
	return fmt.Sprintf("%s.%d-%d", id, time.Now().UnixNano(), f.seq.Add(1))
}

// heldFreeze is one freeze: its thaw (through the descriptor that froze)
// and its record.
type heldFreeze struct {
	rec  freezeRecord
	thaw func() error
}

// recordFreeze makes rec, the freeze named key, durable before the
// freeze it describes.
func (d *Engine) recordFreeze(key string, rec freezeRecord) error {
	dir := freezeDir(d.Paths.Root)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return fsops.WriteFileAtomic(filepath.Join(dir, key+".json"), b, 0o600)
}

// dropFreeze removes the record of freeze key, which is over (thawed, or
// never made).
func (d *Engine) dropFreeze(key string) error {
	return fsops.RemoveDurable(filepath.Join(freezeDir(d.Paths.Root), key+".json"))
}

// thawAttempts and thawRetry bound the retries of a thaw that fails.
const (
	thawAttempts = 5
	thawRetry    = 100 * time.Millisecond
)

// thaw thaws held freeze key, retrying a failure a few times. Thawed,
// its record goes; still frozen, the freeze stays held (Close tries
// again), its record stays (the next start thaws it), and health reports
// it.
func (d *Engine) thaw(key string) error {
	d.freezes.mu.Lock()
	h := d.freezes.held[key]
	d.freezes.mu.Unlock()
	if h == nil {
		return nil
	}
	var err error
	for i := range thawAttempts {
		if i > 0 {
			time.Sleep(thawRetry)
		}
		if err = h.thaw(); err == nil {
			break
		}
	}
	d.freezes.mu.Lock()
	defer d.freezes.mu.Unlock()
	if err != nil {
		d.freezes.stuck[key] = err
		klog.ErrorS(err, "thawing an image volume's file system failed; Close and the next start try again", "volume_id", h.rec.Volume, "path", h.rec.Path)
		return err
	}
	delete(d.freezes.held, key)
	delete(d.freezes.stuck, key)
	if err := d.dropFreeze(key); err != nil {
		klog.ErrorS(err, "removing the record of a thawed freeze; the next start finds the file system thawed", "volume_id", h.rec.Volume)
	}
	return nil
}

// StuckFreezes are the volumes whose file system this driver froze and
// could not thaw: their pods' writes wait.
func (d *Engine) StuckFreezes() map[string]error {
	d.freezes.mu.Lock()
	defer d.freezes.mu.Unlock()
	out := make(map[string]error, len(d.freezes.stuck))
	for key, err := range d.freezes.stuck {
		out[d.freezes.held[key].rec.Volume] = err
	}
	return out
}

// thawHeld thaws every freeze still held (Close).
func (d *Engine) thawHeld() {
	d.freezes.mu.Lock()
	var keys []string
	for key := range d.freezes.held {
		keys = append(keys, key)
	}
	d.freezes.mu.Unlock()
	for _, key := range keys {
		_ = d.thaw(key) // a failure is logged and kept (stuck) for the next start
	}
}

// frozen runs fn with the file systems of the image volumes among vs that
// are mounted frozen (FIFREEZE), and thaws them when fn returns, also on
// an error or a cancelled context: what is on their images while fn runs
// is one instant of each, and of all of them together.
//
// Each image volume's freeze lock is taken, and its record read again
// under it, before it is looked at: a stage takes that lock too, so a
// volume found unmounted stays so until fn is done, and one found mounted
// cannot be unstaged (the freeze holds its root open). Volumes the
// context already holds (a group's) are left as they are; one whose lock
// is busy answers ErrBusy. A file system someone else froze is copied
// frozen as it is, and left so; if it is no longer frozen when fn is done
// (the hook thawed it meanwhile), what fn copied may mix moments and the
// cut is refused (ErrBusy: the same request may succeed later).
//
// A volume's write limits are lifted from before its sync to the thaw
// (liftWriteLimits): on cgroup v2 they would hold the syncs to them.
//
// Pods' writes wait never longer than Config.MaxFreeze from the first
// freeze: at that bound the context fn runs with is cancelled (a copy in
// it stops), the file systems are thawed and, fn done, the cut is refused
// (what fn copied after the thaw would mix moments). The pause is logged.
func (d *Engine) frozen(ctx context.Context, vs []VolumeRecord, fn func(ctx context.Context) error) error {
	held, _ := ctx.Value(frozenKey{}).(map[string]bool)
	now := map[string]bool{}
	for id := range held {
		now[id] = true
	}
	var (
		mu      sync.Mutex
		froze   []string
		overran bool
		unlocks []func()
		// relimit sets the write limits lifted for the freeze again.
		relimit []func()
		bound   *time.Timer
		start   time.Time
	)
	thawAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, key := range froze {
			_ = d.thaw(key) // a failure is logged and kept (stuck); the cut's answer is fn's
		}
		froze = nil
	}
	defer func() {
		if bound != nil {
			bound.Stop()
		}
		thawAll()
		for _, r := range relimit {
			r()
		}
		for _, u := range unlocks {
			u()
		}
	}()
	// First every member's lock, record and mount, each written back
	// while its pods still write (so the freezes that follow have little
	// left to write with writers blocked); then the freezes, back to back.
	var toFreeze []freezeRecord
	for _, v := range vs {
		if !isImage(v) || now[v.ID] {
			continue
		}
		unlock, err := d.lockFreeze(v.ID)
		if err != nil {
			return err
		}
		unlocks = append(unlocks, unlock)
		now[v.ID] = true
		cur, ok := d.Records.Volumes.Get(v.ID)
		if !ok {
			continue // the caller pinned it: gone only if it never was
		}
		path, dev, err := d.mountedDev(cur)
		if err != nil {
			return err
		}
		if path == "" {
			continue // not mounted, and stays so: nothing writes to it
		}
		relimit = append(relimit, d.liftWriteLimits(cur))
		if err := fsops.SyncFS(path); err != nil {
			return fmt.Errorf("syncing the file system of volume %s at %s: %w", v.ID, path, err)
		}
		toFreeze = append(toFreeze, freezeRecord{Volume: v.ID, Image: d.VolumeDataPath(cur), Dev: dev, Path: path})
	}
	fnCtx, cancel := context.WithCancel(context.WithValue(ctx, frozenKey{}, now))
	defer cancel()
	if len(toFreeze) > 0 {
		start = time.Now()
		bound = time.AfterFunc(d.Config.MaxFreeze, func() {
			mu.Lock()
			overran = true
			mu.Unlock()
			cancel()
			thawAll()
		})
	}
	var others []freezeRecord // frozen by someone else
	for _, rec := range toFreeze {
		mu.Lock()
		late := overran
		mu.Unlock()
		if late {
			break
		}
		key, err := d.freezeOne(rec)
		switch {
		case errors.Is(err, unix.EBUSY):
			klog.InfoS("image volume's file system is frozen already (by someone else, e.g. a backup hook's fsfreeze): copied as it is and left frozen", "volume_id", rec.Volume, "path", rec.Path)
			others = append(others, rec)
		case errors.Is(err, unix.ESTALE):
			// No longer mounted where it was found: nothing to freeze.
		case err != nil:
			return err
		default:
			mu.Lock()
			froze = append(froze, key)
			mu.Unlock()
		}
	}
	mu.Lock()
	n, late := len(froze), overran
	mu.Unlock()
	var err error
	if !late {
		err = fn(fnCtx)
	}
	if err == nil && !late {
		err = d.stillFrozen(others)
	}
	if bound != nil {
		bound.Stop()
	}
	if n > 0 {
		klog.InfoS("image volumes frozen", "volumes", n, "pause", min(time.Since(start), d.Config.MaxFreeze))
	}
	mu.Lock()
	late = overran
	mu.Unlock()
	// An overrun cancelled fn's context: a copy that stopped on it is the
	// overrun, not a failure of its own.
	if late && (err == nil || errors.Is(err, context.Canceled) && ctx.Err() == nil) {
		return StorageErr(ErrOverran, "the copy of %d image volumes took longer than --max-freeze=%v, so their file systems were thawed, the copy stopped, and the cut is refused (a copy after the thaw would mix moments); on a pool that shares blocks (XFS with reflink, btrfs) the copy takes milliseconds, or raise --max-freeze", len(toFreeze), d.Config.MaxFreeze)
	}
	return err
}

// freezeOne records and makes one freeze and returns its key. A file
// system frozen already (EBUSY: someone else's freeze, a backup hook's)
// is not ours to thaw, and one no longer mounted where it was found
// (ESTALE) has nothing to freeze: both are errors that unwrap to their
// errno, with no freeze held and no record left.
func (d *Engine) freezeOne(rec freezeRecord) (string, error) {
	key := d.freezes.newKey(rec.Volume)
	if err := d.recordFreeze(key, rec); err != nil {
		return "", fmt.Errorf("recording the freeze of volume %s: %w", rec.Volume, err)
	}
	thaw, err := fsops.FreezeHeld(rec.Path, rec.Dev)
	if err != nil {
		if derr := d.dropFreeze(key); derr != nil {
			klog.ErrorS(derr, "removing the record of a freeze not made", "volume_id", rec.Volume)
		}
		return "", fmt.Errorf("freezing the file system of volume %s at %s: %w", rec.Volume, rec.Path, err)
	}
	d.freezes.mu.Lock()
	d.freezes.held[key] = &heldFreeze{rec: rec, thaw: thaw}
	d.freezes.mu.Unlock()
	return key, nil
}

// stillFrozen checks, after a copy, that the file systems someone else
// had frozen when it began are frozen still, by freezing each again:
// EBUSY says it is. One that freezes (its freezer thawed it during the
// copy, and writes may have landed in it) is thawed at once and the cut
// refused; so is one no longer mounted there (ESTALE: thawed and
// unstaged).
func (d *Engine) stillFrozen(recs []freezeRecord) error {
	for _, rec := range recs {
		key, err := d.freezeOne(rec)
		if errors.Is(err, unix.EBUSY) {
			continue
		}
		if err == nil {
			_ = d.thaw(key) // a failure is logged and kept (stuck)
		} else if !errors.Is(err, unix.ESTALE) {
			return err
		}
		return StorageErr(ErrBusy, "the file system of volume %s was frozen by someone else (a backup hook's fsfreeze?) when its copy began and was thawed before the copy ended, so the copy may mix moments and is refused; keep it frozen until the snapshot is ready, or leave the freeze to the driver", rec.Volume)
	}
	return nil
}

// freezeKey is the lock of a volume's freeze, taken by a freeze and by a
// stage (and online growth) of the volume.
func freezeKey(id string) string { return "freeze/" + id }

// lockFreeze takes volume id's freeze lock: its file system is not
// frozen, copied, staged or grown by anyone else meanwhile.
func (d *Engine) lockFreeze(id string) (func(), error) {
	return d.Locks.lock("volume "+id+" (a stage, a growth, or a snapshot, clone or send being cut)", freezeKey(id))
}

// thawRecorded thaws, at start and before anything else, every file
// system a driver killed between a freeze and its thaw left frozen: for
// each recorded freeze, the mounts of whichever loop device is bound to
// its image now (a reboot leaves none, and nothing frozen). What it
// cannot inspect or thaw is logged and its record kept for the next
// start; it never fails the start.
func thawRecorded(root string) {
	dir := freezeDir(root)
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !os.IsNotExist(err) {
			klog.ErrorS(err, "reading the records of freezes a stopped driver may have left", "dir", dir)
		}
		return
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if thawOneRecorded(path) {
			if err := fsops.RemoveDurable(path); err != nil {
				klog.ErrorS(err, "removing a freeze record", "record", path)
			}
		}
	}
}

// thawOneRecorded thaws what the freeze record at path names and says
// whether the record is done with.
func thawOneRecorded(path string) bool {
	b, err := os.ReadFile(path)
	var rec freezeRecord
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil || rec.Image == "" {
		// A torn record (the crash cut its write) was never followed
		// by a freeze: records are durable before FIFREEZE.
		klog.ErrorS(err, "an unreadable freeze record: its freeze was never made", "record", path)
		return true
	}
	devs, err := loop.FindAll(rec.Image)
	if err != nil {
		klog.ErrorS(err, "finding the loop devices of an image a stopped driver froze; the next start tries again", "volume_id", rec.Volume, "image", rec.Image)
		return false
	}
	done := true
	for _, dev := range devs {
		mounts, err := fsops.MountsOn(dev.Rdev)
		if err != nil {
			klog.ErrorS(err, "listing the mounts of an image volume's device; the next start tries again", "volume_id", rec.Volume, "device", dev.Path())
			done = false
			continue
		}
		for _, m := range mounts {
			was, err := fsops.ThawOn(m, dev.Rdev)
			if err != nil {
				klog.ErrorS(err, "could not inspect or thaw a mount of an image volume a stopped driver froze; the next start tries again", "volume_id", rec.Volume, "path", m)
				done = false
				continue
			}
			if was {
				klog.InfoS("repair: thawed an image volume's file system that a stopped driver left frozen", "volume_id", rec.Volume, "path", m)
				break // every other mount of it is the same super block
			}
		}
	}
	return done
}
