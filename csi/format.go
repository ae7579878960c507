package csi

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
//
// A driver finding a newer format refuses to start and changes nothing: it
// cannot know what it would misread or undo. An older format is read as
// it is and recorded as the current one once start has made it so.
const stateFormat = 2

const formatPrefix = "hostpath-csi state format "

func (l layout) formatFile() string { return filepath.Join(l.meta(), "format") }

// checkStateFormat runs before anything is written to the state dir.
func (d *Driver) checkStateFormat() error {
	b, err := os.ReadFile(d.paths.formatFile())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state dir %s: reading its format: %w", d.paths.root, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(b), formatPrefix)))
	if err != nil || !strings.HasPrefix(string(b), formatPrefix) {
		return fmt.Errorf("state dir %s: %s does not say a format (%q); nothing was changed", d.paths.root, d.paths.formatFile(), strings.TrimSpace(string(b)))
	}
	if n > stateFormat {
		return fmt.Errorf("state dir %s was written by a newer driver (state format %d; this one reads formats up to %d): run that release or a newer one; nothing was changed", d.paths.root, n, stateFormat)
	}
	return nil
}

// recordStateFormat writes the current format, durably, once start has
// brought the state dir to it.
func (d *Driver) recordStateFormat() error {
	want := fmt.Sprintf("%s%d\n", formatPrefix, stateFormat)
	if b, err := os.ReadFile(d.paths.formatFile()); err == nil && string(b) == want {
		return nil
	}
	return fsops.WriteFileAtomic(d.paths.formatFile(), []byte(want), 0o644)
}
