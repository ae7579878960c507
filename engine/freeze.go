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
// driver makes is recorded (freezes/<volume id>.json in the state dir,
// durable) before FIFREEZE, and removed once thawed; the next start thaws
// exactly those, first, from mountinfo and the loop devices' backing files
// alone, before anything that can fail. A file system someone else froze
// (a backup tool's fsfreeze hook) is copied as it is and left frozen, at
// the snapshot and at start: thawing it is the hook's to do.

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

// freezes are this driver's freezes in progress, by volume id: what
// Close thaws, and what health reports of a thaw that failed.
type freezes struct {
	mu    sync.Mutex
	held  map[string]*heldFreeze
	stuck map[string]error
}

// heldFreeze is one freeze: its thaw (through the descriptor that froze)
// and its record.
type heldFreeze struct {
	rec  freezeRecord
	thaw func() error
}

// recordFreeze makes rec durable before the freeze it describes.
func (d *Engine) recordFreeze(rec freezeRecord) error {
	dir := freezeDir(d.Paths.Root)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return fsops.WriteFileAtomic(filepath.Join(dir, rec.Volume+".json"), b, 0o600)
}

// dropFreeze removes the record of a freeze that is over (thawed, or
// never made).
func (d *Engine) dropFreeze(id string) error {
	return fsops.RemoveDurable(filepath.Join(freezeDir(d.Paths.Root), id+".json"))
}

// thawAttempts and thawRetry bound the retries of a thaw that fails.
const (
	thawAttempts = 5
	thawRetry    = 100 * time.Millisecond
)

// thaw thaws volume id's held freeze, retrying a failure a few times.
// Thawed, its record goes; still frozen, the freeze stays held (Close
// tries again), its record stays (the next start thaws it), and health
// reports it.
func (d *Engine) thaw(id string) error {
	d.freezes.mu.Lock()
	h := d.freezes.held[id]
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
		d.freezes.stuck[id] = err
		klog.ErrorS(err, "thawing an image volume's file system failed; Close and the next start try again", "volume_id", id, "path", h.rec.Path)
		return err
	}
	delete(d.freezes.held, id)
	delete(d.freezes.stuck, id)
	if err := d.dropFreeze(id); err != nil {
		klog.ErrorS(err, "removing the record of a thawed freeze; the next start finds the file system thawed", "volume_id", id)
	}
	return nil
}

// StuckFreezes are the volumes whose file system this driver froze and
// could not thaw: their pods' writes wait.
func (d *Engine) StuckFreezes() map[string]error {
	d.freezes.mu.Lock()
	defer d.freezes.mu.Unlock()
	out := make(map[string]error, len(d.freezes.stuck))
	for id, err := range d.freezes.stuck {
		out[id] = err
	}
	return out
}

// thawHeld thaws every freeze still held (Close).
func (d *Engine) thawHeld() {
	d.freezes.mu.Lock()
	var ids []string
	for id := range d.freezes.held {
		ids = append(ids, id)
	}
	d.freezes.mu.Unlock()
	for _, id := range ids {
		d.thaw(id)
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
// frozen as it is, and left so.
//
// Pods' writes wait never longer than Config.MaxFreeze from the first
// freeze: at that bound the file systems are thawed and, fn done, the cut
// is refused (what fn copied after the thaw would mix moments). The pause
// is logged.
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
		bound   *time.Timer
		start   time.Time
	)
	thawAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range froze {
			d.thaw(id)
		}
		froze = nil
	}
	defer func() {
		if bound != nil {
			bound.Stop()
		}
		thawAll()
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
		if err := fsops.SyncFS(path); err != nil {
			return fmt.Errorf("syncing the file system of volume %s at %s: %w", v.ID, path, err)
		}
		toFreeze = append(toFreeze, freezeRecord{Volume: v.ID, Image: d.VolumeDataPath(cur), Dev: dev, Path: path})
	}
	if len(toFreeze) > 0 {
		start = time.Now()
		bound = time.AfterFunc(d.Config.MaxFreeze, func() {
			mu.Lock()
			overran = true
			mu.Unlock()
			thawAll()
		})
	}
	for _, rec := range toFreeze {
		mu.Lock()
		late := overran
		mu.Unlock()
		if late {
			break
		}
		ok, err := d.freezeOne(rec)
		if err != nil {
			return err
		}
		if ok {
			mu.Lock()
			froze = append(froze, rec.Volume)
			mu.Unlock()
		}
	}
	mu.Lock()
	n, late := len(froze), overran
	mu.Unlock()
	var err error
	if !late {
		err = fn(context.WithValue(ctx, frozenKey{}, now))
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
	if err == nil && late {
		return StorageErr(ErrOverran, "the copy of %d image volumes took longer than --max-freeze=%v, so their file systems were thawed before it ended and the cut is refused (a copy after the thaw would mix moments); on a pool that shares blocks (XFS with reflink, btrfs) the copy takes milliseconds, or raise --max-freeze", len(toFreeze), d.Config.MaxFreeze)
	}
	return err
}

// freezeOne records and makes one freeze, and says whether it made it: a
// file system frozen already (EBUSY: someone else's freeze, a backup
// hook's) is not ours to thaw, and one no longer mounted where it was
// found (ESTALE) has nothing to freeze.
func (d *Engine) freezeOne(rec freezeRecord) (bool, error) {
	if err := d.recordFreeze(rec); err != nil {
		return false, fmt.Errorf("recording the freeze of volume %s: %w", rec.Volume, err)
	}
	thaw, err := fsops.FreezeHeld(rec.Path, rec.Dev)
	if err != nil {
		if derr := d.dropFreeze(rec.Volume); derr != nil {
			klog.ErrorS(derr, "removing the record of a freeze not made", "volume_id", rec.Volume)
		}
		switch {
		case errors.Is(err, unix.EBUSY):
			klog.InfoS("image volume's file system is frozen already (by someone else, e.g. a backup hook's fsfreeze): copied as it is and left frozen", "volume_id", rec.Volume, "path", rec.Path)
			return false, nil
		case errors.Is(err, unix.ESTALE):
			return false, nil
		}
		return false, fmt.Errorf("freezing the file system of volume %s at %s: %w", rec.Volume, rec.Path, err)
	}
	d.freezes.mu.Lock()
	d.freezes.held[rec.Volume] = &heldFreeze{rec: rec, thaw: thaw}
	d.freezes.mu.Unlock()
	return true, nil
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
