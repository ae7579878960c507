package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	xrate "golang.org/x/time/rate"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/engine/store"
	"github.com/hostpath-csi/hostpath/fsops"
)

// The standby's end of a standby copy (see standby.go): its record, and
// the pull that makes a new generation.

// StandbyRecord is a copy this node keeps of another node's volume.
type StandbyRecord = store.Standby

// standbyMagic opens a standby stream: then the generation the delta
// applies to and the one it makes, then the delta.
const standbyMagic = "hostpath-standby"

func writeStandbyHeader(w io.Writer, base, gen uint64) error {
	b := make([]byte, len(standbyMagic)+16)
	copy(b, standbyMagic)
	binary.BigEndian.PutUint64(b[len(standbyMagic):], base)
	binary.BigEndian.PutUint64(b[len(standbyMagic)+8:], gen)
	_, err := w.Write(b)
	return err
}

func readStandbyHeader(r io.Reader) (base, gen uint64, err error) {
	b := make([]byte, len(standbyMagic)+16)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, 0, fmt.Errorf("%w: no standby header: %v", archive.ErrFormat, err)
	}
	if string(b[:len(standbyMagic)]) != standbyMagic {
		return 0, 0, fmt.Errorf("%w: not a standby stream", archive.ErrFormat)
	}
	return binary.BigEndian.Uint64(b[len(standbyMagic):]), binary.BigEndian.Uint64(b[len(standbyMagic)+8:]), nil
}

// standbyKey is the lock of the copy this node keeps of volume id.
func standbyKey(id string) string { return "standby/" + id }

// StandbySpec is a copy to keep of another node's volume, as that
// volume's PersistentVolume describes it.
type StandbySpec struct {
	// Volume is the volume's id; Primary the node that holds it, which
	// the id itself must name (a volume id carries its node's tag).
	Volume, Primary string
	// Pool is where the copy is kept here ("" for the state dir's).
	Pool, Access, Layout string
	Interval             time.Duration
	PV                   string
}

// AddStandby records that this node keeps a copy of a volume of another
// node: no one makes it pull a volume from a node that is not the
// volume's. It is idempotent for the same primary.
func (d *Engine) AddStandby(spec StandbySpec) (StandbyRecord, error) {
	id := spec.Volume
	if !ValidVolumeID(id) {
		return StandbyRecord{}, StorageErr(ErrInvalid, "%q is not a volume id", id)
	}
	if tag := nodeTagOf(id); tag == d.Tag || tag != NodeTag(spec.Primary) {
		return StandbyRecord{}, StorageErr(ErrInvalid, "volume %s is not a volume of node %s", id, spec.Primary)
	}
	if _, ok := d.Pools[spec.Pool]; spec.Pool != "" && !ok {
		return StandbyRecord{}, StorageErr(ErrInvalid, "no pool %q on this node", spec.Pool)
	}
	unlock, err := d.Locks.lock("the standby copy of volume "+id, standbyKey(id))
	if err != nil {
		return StandbyRecord{}, err
	}
	defer unlock()
	// Promoted here, the volume is this node's: its PV, which still names
	// this node its standby, makes no copy of it.
	if v, ok := d.Records.Volumes.Get(id); ok && v.Epoch > 0 {
		return StandbyRecord{}, nil
	}
	if s, ok := d.Records.Standbys.Get(id); ok {
		if s.Primary != spec.Primary {
			return StandbyRecord{}, StorageErr(ErrExists, "this node stands by for volume %s of node %s, not %s", id, s.Primary, spec.Primary)
		}
		return s, nil
	}
	every := spec.Interval
	if every <= 0 {
		every = DefaultStandbyInterval
	}
	s := StandbyRecord{Volume: id, Primary: spec.Primary, Phase: PhaseReady, Pool: spec.Pool, AccessType: spec.Access,
		Layout: spec.Layout, CreatedAt: time.Now().UTC(), IntervalSeconds: int(max(every/time.Second, 1)), PV: spec.PV}
	// The record is durable before its directory holds anything (the
	// first pull makes it): a start never finds generations it has no
	// record of.
	if err := d.Records.Standbys.Put(s); err != nil {
		return StandbyRecord{}, err
	}
	return s, nil
}

// StandbyState is what a pull did: the generation this node now holds,
// the one the changes applied to (0: none, the whole image came), and the
// bytes of data received.
type StandbyState struct {
	Generation, Base uint64
	Bytes            int64
}

// StandbyGeneration is the newest complete generation this node holds of
// volume id's copy (0: none yet) and its path.
func (d *Engine) StandbyGeneration(id string) (uint64, string, error) {
	s, ok := d.Records.Standbys.Get(id)
	if !ok {
		return 0, "", StorageErr(ErrNotFound, "this node keeps no copy of volume %s", id)
	}
	dir := standbyDir(d.PoolOf(s.Pool).Paths.Root, id)
	gens, err := generations(dir, "gen")
	if err != nil || len(gens) == 0 {
		return 0, "", err
	}
	g := gens[len(gens)-1]
	return g, filepath.Join(dir, genName(g)), nil
}

// CatchUp pulls from its primary what changed in volume id since the
// generation this node holds and makes it the newest generation: applied
// to a copy of the held one (a reflink where the pool shares blocks),
// synced, then named. A failure at any point leaves the held generation
// as it was; older generations are removed once the new one is named.
func (d *Engine) CatchUp(ctx context.Context, id string) (StandbyState, error) {
	return d.pullGeneration(ctx, id, SourceStandby)
}

// pullGeneration is CatchUp, by transfer kind: SourceStandby, or
// SourceHandover for the last changes of a move.
func (d *Engine) pullGeneration(ctx context.Context, id, kind string) (StandbyState, error) {
	s, ok := d.Records.Standbys.Get(id)
	if !ok {
		return StandbyState{}, StorageErr(ErrNotFound, "this node keeps no copy of volume %s", id)
	}
	var unlock func()
	var err error
	if kind == SourceHandover {
		unlock, err = d.takeCopy(ctx, id) // a move goes before a regular pull
	} else {
		unlock, err = d.Locks.lock("the standby copy of volume "+id, standbyKey(id))
	}
	if err != nil {
		return StandbyState{}, err
	}
	defer unlock()
	ctx, done := d.copyPulling(ctx, id)
	defer done()
	peers := d.peerSet()
	if peers == nil {
		return StandbyState{}, fmt.Errorf("no node-to-node transfer: the copy of volume %s cannot be kept", id)
	}
	// Its primary's, which is the id's own node until a move or a
	// promotion.
	tag := NodeTag(s.Primary)
	// A pool that is down has its disk missing: what would be written is
	// the mount point's, on another disk.
	if down := d.PoolOf(s.Pool).Get().Down; down != nil {
		return StandbyState{}, fmt.Errorf("the copy of volume %s is kept in pool %s, which is down: %w", id, d.PoolOf(s.Pool).Name, down)
	}
	dir := standbyDir(d.PoolOf(s.Pool).Paths.Root, id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return StandbyState{}, err
	}
	gens, err := generations(dir, "gen")
	if err != nil {
		return StandbyState{}, err
	}
	var held uint64
	if len(gens) > 0 {
		held = gens[len(gens)-1]
	}
	clearPartial(dir)
	_, body, node, err := peers.Open(ctx, tag, kind, StandbyID(id, held), false)
	if err != nil {
		return StandbyState{}, peerStatus(err, kind, id, node)
	}
	defer body.Close()
	var r io.Reader = body
	if bw := d.Config.StandbyBandwidth; bw > 0 {
		r = &paced{r: body, lim: xrate.NewLimiter(xrate.Limit(bw), int(min(bw, 1<<20))), ctx: ctx}
	}
	base, gen, err := readStandbyHeader(r)
	if err != nil {
		return StandbyState{}, fmt.Errorf("the changes of volume %s from node %s: %w", id, node, err)
	}
	if (base != held && base != 0) || gen <= held {
		return StandbyState{}, fmt.Errorf("node %s sent generation %d over %d, this node holds %d", node, gen, base, held)
	}
	tmp := filepath.Join(dir, genName(gen)+".tmp")
	st, err := d.applyGeneration(ctx, dir, held, base, tmp, r)
	if err != nil {
		os.Remove(tmp)
		return StandbyState{}, fmt.Errorf("generation %d of volume %s from node %s: %w", gen, id, node, err)
	}
	// Durable before it is named; named, then older ones go.
	if err := fsops.SyncFile(tmp); err != nil {
		os.Remove(tmp)
		return StandbyState{}, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, genName(gen))); err != nil {
		os.Remove(tmp)
		return StandbyState{}, err
	}
	if err := fsops.SyncDir(dir); err != nil {
		return StandbyState{}, err
	}
	for _, g := range gens {
		os.Remove(filepath.Join(dir, genName(g)))
	}
	return StandbyState{Generation: gen, Base: base, Bytes: st.Bytes}, nil
}

// applyGeneration makes tmp from the held generation (or nothing, when
// base is 0) and the delta in r.
func (d *Engine) applyGeneration(ctx context.Context, dir string, held, base uint64, tmp string, r io.Reader) (archive.Stats, error) {
	out, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return archive.Stats{}, err
	}
	defer out.Close()
	if base > 0 {
		in, err := os.Open(filepath.Join(dir, genName(held)))
		if err != nil {
			return archive.Stats{}, err
		}
		defer in.Close()
		size, _, err := fsops.FileSize(in)
		if err != nil {
			return archive.Stats{}, err
		}
		if _, err := fsops.CopyFileData(ctx, int(out.Fd()), int(in.Fd()), size, nil); err != nil {
			return archive.Stats{}, err
		}
	}
	// What the pool has room for bounds what a primary may make this node
	// write.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(out.Fd()), &fs); err != nil {
		return archive.Stats{}, err
	}
	room := int64(fs.Bavail) * fs.Bsize
	if fi, err := out.Stat(); err == nil {
		room += fi.Size()
	}
	_, st, err := archive.ApplyDelta(ctx, r, out, room)
	return st, err
}

// paced reads no faster than its limiter allows.
type paced struct {
	r   io.Reader
	lim *xrate.Limiter
	ctx context.Context
}

func (p *paced) Read(b []byte) (int, error) {
	if len(b) > p.lim.Burst() {
		b = b[:p.lim.Burst()]
	}
	n, err := p.r.Read(b)
	if n > 0 {
		if werr := p.lim.WaitN(p.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

// clearPartial removes what an interrupted pull left in dir.
func clearPartial(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// DropStandby forgets the copy this node keeps of volume id and removes
// its generations: the record goes first (durably), so a crash in between
// leaves files without a record, which nothing reads.
func (d *Engine) DropStandby(id string) error {
	s, ok := d.Records.Standbys.Get(id)
	if !ok {
		return nil
	}
	unlock, err := d.Locks.lock("the standby copy of volume "+id, standbyKey(id))
	if err != nil {
		return err
	}
	defer unlock()
	if err := d.Records.Standbys.Drop(id); err != nil {
		return err
	}
	if err := fsops.RemoveAll(standbyDir(d.PoolOf(s.Pool).Paths.Root, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
