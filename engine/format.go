package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hostpath-csi/hostpath/fsops"
)

// stateFormat is the layout of the state dir this driver reads and
// writes, recorded in meta/format:
//
//	1  records, journal and data as the first releases wrote them (no
//	   meta/format file)
//	2  the journal's appends after a sync start on a 4 KiB block of their
//	   own, and its entries are numbered
//	3  as 2, and image volumes exist (records with layout "image", whose
//	   data is volumes/<id>.img): written before the first image record,
//	   and while any is left
//
// A driver finding a newer format refuses to start and changes nothing: it
// cannot know what it would misread or undo. An older format is read as
// it is and recorded as the current one once start has made it so. The
// format recorded is the lowest that describes the state: a state dir
// with no image volume stays at 2, so the previous release still starts
// on it.
const stateFormat = formatImages

// The formats this driver writes.
const (
	formatNumbered = 2
	formatImages   = 3
)

const formatPrefix = "hostpath-csi state format "

func (l layout) FormatFile() string { return filepath.Join(l.Meta(), "format") }

// checkStateFormat runs before anything is written to the state dir.
func (d *Engine) checkStateFormat() error {
	b, err := os.ReadFile(d.Paths.FormatFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state dir %s: reading its format: %w", d.Paths.Root, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(b), formatPrefix)))
	if err != nil || !strings.HasPrefix(string(b), formatPrefix) {
		return fmt.Errorf("state dir %s: %s does not say a format (%q); nothing was changed", d.Paths.Root, d.Paths.FormatFile(), strings.TrimSpace(string(b)))
	}
	if n > stateFormat {
		return fmt.Errorf("state dir %s was written by a newer driver (state format %d; this one reads formats up to %d): run that release or a newer one; nothing was changed", d.Paths.Root, n, stateFormat)
	}
	return nil
}

// recordStateFormat writes the format the state needs, durably, once
// start has brought the state dir to it: images if any record is of an
// image volume, else numbered.
func (d *Engine) recordStateFormat() error {
	n := formatNumbered
	if d.holdsImages() {
		n = formatImages
	}
	d.formatMu.Lock()
	defer d.formatMu.Unlock()
	return d.writeStateFormat(n)
}

// holdsImages reports whether any record is of an image volume.
func (d *Engine) holdsImages() bool {
	for _, v := range d.Records.Volumes.All() {
		if isImage(v) {
			return true
		}
	}
	return false
}

// raiseStateFormat records format n, durably, unless the state dir is
// already at it: before the first change only that format describes.
func (d *Engine) raiseStateFormat(n int) error {
	d.formatMu.Lock()
	defer d.formatMu.Unlock()
	if d.format >= n {
		return nil
	}
	return d.writeStateFormat(n)
}

// writeStateFormat writes format n; the caller holds formatMu.
func (d *Engine) writeStateFormat(n int) error {
	want := fmt.Sprintf("%s%d\n", formatPrefix, n)
	if b, err := os.ReadFile(d.Paths.FormatFile()); err != nil || string(b) != want {
		if err := fsops.WriteFileAtomic(d.Paths.FormatFile(), []byte(want), 0o644); err != nil {
			return err
		}
	}
	d.format = n
	return nil
}

// downgradeGuard is a directory in the state dir's tmp/ that stands while
// the journal may hold changes the previous release (PREVIOUS_RELEASE)
// would misread: from start until a clean stop has checkpointed it. That
// release reads the journal only up to the first gap between synced
// batches, so after a crash of this driver it would apply a prefix of the
// live epoch (a volume's "creating" without its later "ready") and its
// reconcile would delete the data of a volume the CO was told exists.
// Before it reads anything it proves the state dir writable by renaming a
// file onto tmp/.write-probe: with a non-empty directory there the rename
// fails (EEXIST), and it refuses to start, having changed nothing. After a
// clean stop the guard is gone and that release serves the state.
const downgradeGuard = ".write-probe"

// guardNote is what a person finds in the guard.
const guardNote = `A hostpath CSI driver newer than its previous release runs on this state
dir, or did not stop cleanly (it was killed, or the node lost power), or
the state dir holds image volumes (layout: image), which the previous
release does not know. Its journal may hold changes that the previous
release would misread, so that release refuses to start here. Start the
current release once and stop it (SIGTERM): its clean stop removes this
directory, once no image volume is left. Do not remove it by hand.
`

// raiseDowngradeGuard puts the guard in place, durably, before anything
// is committed to the journal.
func (d *Engine) raiseDowngradeGuard() error {
	guard := filepath.Join(d.Paths.Tmp(), downgradeGuard)
	if err := os.Mkdir(guard, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := fsops.WriteFileAtomic(filepath.Join(guard, "README"), []byte(guardNote), 0o644); err != nil {
		return err
	}
	return fsops.SyncDir(d.Paths.Tmp())
}

// lowerDowngradeGuard removes the guard once a clean stop has
// checkpointed the journal.
func (d *Engine) lowerDowngradeGuard() error {
	if err := fsops.RemoveAll(filepath.Join(d.Paths.Tmp(), downgradeGuard)); err != nil {
		return err
	}
	return fsops.SyncDir(d.Paths.Tmp())
}
