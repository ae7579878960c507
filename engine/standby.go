package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/transfer"
)

// Standby copies (docs/standby.md). A volume whose record names a standby
// node has a copy there, kept by changed blocks: the standby pulls, every
// interval, the blocks that changed since the generation it holds, over the
// transfer's mutual TLS, and the primary serves them only to the node its
// own record names.
//
// The primary (this file) cuts the volume's image, frozen (a reflink where
// the pool shares blocks), into its standby directory as the cut of a new
// generation, and sends what differs between it and the cut of the
// generation the standby holds, which it kept. On a pool that shares blocks
// the comparison reads only what changed (fsops.ChangedRanges). It keeps
// the cut the standby asked from (the standby may not have taken the new
// one) and the new one; older cuts go once the standby asks from a newer
// one. A standby that holds nothing, or a generation whose cut is gone,
// gets every data range of the new cut.
//
// The standby (standby_copy.go) applies them to a reflink of its newest
// generation and makes the result durable before naming it the newest, so
// it always holds one complete generation.

// SourceStandby is the transfer kind a standby pulls changed blocks by;
// its id is "<volume id>@<generation held>".
const SourceStandby = "standby"

// wireDelta is the form changed blocks travel in (archive.WriteDelta).
const wireDelta = "delta"

// standbyDir is where volume id's standby files are in a pool's root: the
// primary's cuts, or the standby's generations and record.
func standbyDir(root, id string) string { return filepath.Join(root, "standby", id) }

// cutName and genName are the file names of generation g's cut (on the
// primary) and copy (on the standby).
func cutName(g uint64) string { return "cut-" + strconv.FormatUint(g, 10) + ".img" }
func genName(g uint64) string { return "gen-" + strconv.FormatUint(g, 10) + ".img" }

// generations lists the generations of the files named prefix-<g>.img in
// dir, oldest first; a missing dir has none.
func generations(dir, prefix string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), prefix+"-")
		if !ok {
			continue
		}
		n, ok = strings.CutSuffix(n, ".img")
		if g, err := strconv.ParseUint(n, 10, 64); ok && err == nil && g > 0 {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out, nil
}

// StandbyID is the transfer id a standby pulls volume id by, holding
// generation held.
func StandbyID(id string, held uint64) string { return id + "@" + strconv.FormatUint(held, 10) }

// parseStandbyID splits a transfer id made by StandbyID.
func parseStandbyID(s string) (string, uint64, bool) {
	id, g, ok := strings.Cut(s, "@")
	if !ok || !ValidVolumeID(id) {
		return "", 0, false
	}
	held, err := strconv.ParseUint(g, 10, 64)
	return id, held, err == nil
}

// AuthorizeStandby allows peer volume id's changed blocks (a transfer id
// made by StandbyID) when this node's own record of the volume names peer
// as its standby: nothing a peer or the API says makes it so.
func (d *Engine) AuthorizeStandby(peer, standbyID string) error {
	id, _, ok := parseStandbyID(standbyID)
	if !ok {
		return fmt.Errorf("%w: %q is no standby id", transfer.ErrInvalid, standbyID)
	}
	v, ok := d.Records.Volumes.Get(id)
	if !ok || v.Standby == "" || v.Standby != peer {
		return fmt.Errorf("%w: volume %s has no standby on node %s here", transfer.ErrRefused, id, peer)
	}
	return nil
}

// serveStandby is what volume id's standby node pulls: its image cut now,
// as the changes since generation held. It checks the record again (the
// authorizer may be someone else's) and pins the volume.
func (d *Engine) serveStandby(peer, standbyID string) (transfer.Meta, func(context.Context) (io.ReadCloser, error), func(), error) {
	if err := d.AuthorizeStandby(peer, standbyID); err != nil {
		return transfer.Meta{}, nil, nil, err
	}
	id, held, _ := parseStandbyID(standbyID)
	v, unpin, err := d.pinVolume(id)
	if err != nil {
		return transfer.Meta{}, nil, nil, servable(err, SourceStandby, id)
	}
	if !fileBacked(v) {
		unpin()
		return transfer.Meta{}, nil, nil, fmt.Errorf("%w: volume %s is a directory volume; only image and block volumes have standbys", transfer.ErrInvalid, id)
	}
	d.noteAsked(id, standbyDir(d.PoolOf(v.Pool).Paths.Root, id), held)
	m := transfer.Meta{Format: wireDelta, Size: v.CapacityBytes, Attrs: map[string]string{"access": v.AccessType, "layout": layoutOf(v)}}
	open := func(ctx context.Context) (io.ReadCloser, error) {
		// One cut of a volume at a time: a retry while an abandoned
		// pull's cut is still being made is busy, and tries again at
		// its next interval.
		unlock, err := d.Locks.lock("the standby cut of volume "+id, "standby-cut/"+id)
		if err != nil {
			return nil, servable(err, SourceStandby, id)
		}
		c, err := d.cutForStandby(ctx, v, held)
		unlock()
		if err != nil {
			return nil, err
		}
		// The generations are known only once cut, after the Meta went:
		// the stream's own header carries them.
		return produce(ctx, func(ctx context.Context, w io.Writer) error {
			defer c.f.Close()
			if err := writeStandbyHeader(w, c.base, c.gen); err != nil {
				return err
			}
			st, err := archive.WriteDelta(ctx, c.f, c.size, c.changed, w)
			d.noteSent(v.ID, st.Bytes)
			return err
		}), nil
	}
	return m, open, unpin, nil
}

// standbyCut is a new generation's cut, open, and what it sends: the
// ranges changed since generation base (0: every data range).
type standbyCut struct {
	f         *os.File
	size      int64
	base, gen uint64
	changed   []fsops.Extent
}

// cutForStandby cuts v's image as a new generation in its standby
// directory, after the cut of generation held if it is kept (else from
// nothing), and returns it open; the caller closes it.
func (d *Engine) cutForStandby(ctx context.Context, v VolumeRecord, held uint64) (c standbyCut, err error) {
	dir := standbyDir(d.PoolOf(v.Pool).Paths.Root, v.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return c, err
	}
	gens, err := generations(dir, "cut")
	if err != nil {
		return c, err
	}
	c.gen = held + 1
	if len(gens) > 0 {
		c.gen = max(c.gen, gens[len(gens)-1]+1)
	}
	// The standby holds held: earlier cuts are done with, and a later one
	// it never took is replaced by the new one.
	for _, g := range gens {
		if g == held {
			c.base = held
		} else {
			os.Remove(filepath.Join(dir, cutName(g)))
		}
	}
	cut := filepath.Join(dir, cutName(c.gen))
	tmp := cut + ".tmp"
	os.Remove(tmp)
	err = d.frozen(ctx, []VolumeRecord{v}, func(ctx context.Context) error {
		return copyImage(ctx, d.VolumeDataPath(v), tmp)
	})
	if err == nil {
		// The cut is the base of the next delta: durable before it is
		// named, so a crash never leaves a torn cut under a generation's
		// name.
		err = fsops.SyncFile(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, cut)
	}
	if err != nil {
		os.Remove(tmp)
		return c, fmt.Errorf("cutting volume %s for its standby: %w", v.ID, err)
	}
	if c.f, err = os.Open(cut); err != nil {
		return c, err
	}
	defer func() {
		if err != nil {
			c.f.Close()
		}
	}()
	if c.size, _, err = fsops.FileSize(c.f); err != nil {
		return c, err
	}
	if c.base == 0 {
		c.changed, err = fsops.DataExtents(int(c.f.Fd()), 0, c.size)
		return c, err
	}
	bf, err := os.Open(filepath.Join(dir, cutName(c.base)))
	if err != nil {
		return c, err
	}
	defer bf.Close()
	if c.changed, err = fsops.ChangedRanges(bf, c.f, 0, c.size, DeltaBlock); err != nil {
		return c, fmt.Errorf("comparing volume %s's cuts %d and %d: %w", v.ID, c.base, c.gen, err)
	}
	return c, nil
}

// dropStandbyCuts removes volume v's standby directory on the primary (its
// cuts), when the volume goes. A directory this node also keeps a copy of
// the volume in (a promotion under way, or taken back) stays: it holds
// the copy's generations, which go only with the copy's record.
func (d *Engine) dropStandbyCuts(v VolumeRecord) error {
	if _, ok := d.Records.Standbys.Get(v.ID); ok {
		return nil
	}
	dir := standbyDir(d.PoolOf(v.Pool).Paths.Root, v.ID)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil // most volumes have no standby
	}
	return fsops.RemoveAll(dir)
}
