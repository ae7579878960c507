package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/transfer"
)

// Restores and clones whose source lives on another node pull it from that
// node's driver (package transfer moves the bytes, authenticated). This
// file maps the two ends onto the driver: what a node serves (a pinned
// snapshot or volume, in the form its kind travels in) and how a node
// builds a volume from what it receives.

// Kinds of source a peer asks for, and the forms they travel in.
const (
	SourceSnapshot = "snapshot"
	SourceVolume   = "volume"

	wireTarGz   = "tar.gz"  // a directory snapshot's archive as stored
	WireTarZst  = "tar.zst" // as stored, or made on the fly from a tree
	wireExtents = "extents" // a block image's data ranges (archive.WriteExtents)
)

// Peers reaches the drivers of the other nodes: Open asks the node whose
// ids carry tag for a source, and names that node for messages.
type Peers interface {
	Open(ctx context.Context, tag, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, string, error)
}

// SetPeers lets restores and clones pull sources from other nodes. Without
// it a source on another node is ResourceExhausted, as for the reference.
func (d *Engine) SetPeers(p Peers) { d.peers.Store(&p) }

func (d *Engine) peerSet() Peers {
	if p := d.peers.Load(); p != nil {
		return *p
	}
	return nil
}

// remoteSource reports whether a well-formed source id lives on another
// node that this driver can pull from, and that node's tag.
func (d *Engine) remoteSource(id string) (string, bool) {
	if d.peerSet() == nil || (!ValidVolumeID(id) && !ValidSnapshotID(id)) {
		return "", false
	}
	if _, other := d.OtherNode(id); !other {
		return "", false
	}
	return id[len(id)-idHexLen : len(id)-idHexLen+nodeTagLen], true
}

// statRemote asks the node holding a source what it is, checks that it
// can fill a volume of access and layout (a layout the class does not
// name is the source's), and returns its size, the layout, and the file
// system its image holds ("" when it is no image, or the peer predates
// saying so).
func (d *Engine) statRemote(ctx context.Context, tag, kind, id, access, layout string, named bool) (size int64, _ string, fs, node string, err error) {
	m, _, node, err := d.peerSet().Open(ctx, tag, kind, id, true)
	if err != nil {
		return 0, "", "", node, peerStatus(err, kind, id, node)
	}
	// A peer from before layouts sends none: its mount sources are
	// directories.
	srcAccess := m.Attrs["access"]
	srcLayout := orDirectory(srcAccess, m.Attrs["layout"])
	if !named && srcAccess == AccessMount && access == AccessMount {
		layout = srcLayout
	}
	if kind == SourceSnapshot {
		if err := restorable(id+" on node "+node, srcAccess, srcLayout, access, layout); err != nil {
			return 0, "", "", node, err
		}
		return m.Size, layout, m.Attrs[attrFSType], node, nil
	}
	if srcAccess != access {
		return 0, "", "", node, StorageErr(ErrInvalid, "source %s %s on node %s is of a %s volume; it cannot fill a %s volume", kind, id, node, srcAccess, access)
	}
	if srcLayout != layout {
		return 0, "", "", node, StorageErr(ErrInvalid, "source %s %s on node %s is of a %s-layout volume; it cannot fill a %s-layout volume", kind, id, node, srcLayout, layout)
	}
	return m.Size, layout, m.Attrs[attrFSType], node, nil
}

// attrFSType is the transfer attribute naming the file system a source's
// image holds (ext4 or xfs), where it is an image that holds one.
const attrFSType = "fsType"

// imageAttrs adds to m what the image at path holds.
func imageAttrs(m *transfer.Meta, path string) {
	if fs, err := probeFS(path); err == nil {
		m.Attrs[attrFSType] = fs
	}
}

// peerStatus is the answer when a peer could not give a source: it names
// the source and the node, and keeps the transfer's refusal, by which the
// CSI side chooses the code (NotFound if the peer has none,
// ResourceExhausted while it cannot be reached or the stream breaks,
// FailedPrecondition if it refuses).
func peerStatus(err error, kind, id, node string) error {
	if node == "" {
		node = "(not found among the cluster's nodes)"
	}
	return fmt.Errorf("source %s %s from node %s: %w", kind, id, node, err)
}

// pullVolumeData makes a volume's data from a source on another node. The
// caller removes what a failure leaves.
func (d *Engine) pullVolumeData(ctx context.Context, v VolumeRecord, tag string) error {
	kind, id := SourceSnapshot, v.SourceSnapshot
	if id == "" {
		kind, id = SourceVolume, v.SourceVolume
	}
	release, err := d.Heavy.Wait(ctx)
	if err != nil {
		return err
	}
	defer release()
	m, body, node, err := d.peerSet().Open(ctx, tag, kind, id, false)
	if err != nil {
		return peerStatus(err, kind, id, node)
	}
	defer body.Close()
	op := "restore"
	if kind == SourceVolume {
		op = "clone"
	}
	ctx, done := d.track(ctx, op, v.ID, m.Size)
	defer done()
	in := &watchedReader{r: body}
	if err := d.buildFrom(ctx, v, m, in); err != nil {
		// A stream that broke is the peer's failure, whatever the
		// extraction made of it (a truncated archive, most often).
		if in.err != nil && !errors.Is(in.err, io.EOF) {
			return peerStatus(in.err, kind, id, node)
		}
		return err
	}
	return nil
}

// watchedReader keeps the first error its reader returned.
type watchedReader struct {
	r   io.Reader
	err error
}

func (w *watchedReader) Read(b []byte) (int, error) {
	n, err := w.r.Read(b)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}

// buildFrom writes a received stream into the volume's data.
func (d *Engine) buildFrom(ctx context.Context, v VolumeRecord, m transfer.Meta, body io.Reader) error {
	return d.layoutFor(v).build(ctx, v, m, body)
}

// buildExtents writes a file-backed volume's file from received extents,
// made durable before it appears; finish gives the file its size.
func (d *Engine) buildExtents(ctx context.Context, v VolumeRecord, body io.Reader, finish func(*os.File) error) error {
	path := d.VolumeDataPath(v)
	tmp := filepath.Join(tmpBeside(path), filepath.Base(path)+".partial")
	return fsops.CreateDurable(path, tmp, 0o600, func(out *os.File) error {
		// The volume's size, never the source's. A live source's size
		// was asked for with another request, unpinned in between: one
		// grown since is refused before a byte is written (never
		// written in full past the capacity reserved and then cut). A
		// snapshot, which cannot change, is cut to the new volume's size
		// as a local restore is (copyBacking): a block snapshot's
		// recorded size may be less than its image's length.
		limit := archive.ExtentsLimit{Max: v.CapacityBytes, Clip: v.SourceSnapshot != ""}
		_, st, err := extractExtents(ctx, body, out, limit)
		d.moved("restore", st.Bytes)
		if err != nil {
			return err
		}
		return finish(out)
	})
}

// treeFormat refuses a stream that is no tree.
func treeFormat(m transfer.Meta) error {
	if m.Format != wireTarGz && m.Format != WireTarZst {
		return fmt.Errorf("%w: a directory source came as %q", archive.ErrFormat, m.Format)
	}
	return nil
}

// extractTree extracts a received tree into dir (its format checked) and
// checks the archive's checksum where the source has one.
func (d *Engine) extractTree(ctx context.Context, m transfer.Meta, body io.Reader, path string) error {
	h := sha256.New()
	in := io.TeeReader(body, h)
	// What another node serves is untrusted: no device nodes, setuid or
	// file capabilities (a node taken could plant them for a tenant).
	st, err := archive.ExtractUntrusted(ctx, in, path)
	d.moved("restore", st.Bytes)
	if st.SkippedDevices > 0 {
		klog.InfoS("a restore from another node left out device nodes", "path", path, "devices", st.SkippedDevices)
	}
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, in); err != nil { // to the end, where the checksum is checked
		return err
	}
	if want := m.Attrs["sha256"]; want != "" {
		if got := hex.EncodeToString(h.Sum(nil)); got != want {
			return fmt.Errorf("%w: the archive received has sha256 %s, recorded %s", ErrCorrupt, got, want)
		}
	}
	return nil
}

func extractExtents(ctx context.Context, r io.Reader, out *os.File, limit archive.ExtentsLimit) (int64, archive.Stats, error) {
	size, st, err := archive.ExtractExtents(ctx, r, out, limit)
	if err != nil {
		return 0, st, err
	}
	// Read to the end: the transfer's checksum is checked there.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return 0, st, err
	}
	return size, st, nil
}

// TransferSource is what this node serves to its peers.
func (d *Engine) TransferSource() transfer.Source { return (*peerSource)(d) }

type peerSource Engine

// Open pins the source and returns it in the form it travels in. Only
// well-formed ids of this node are looked up.
func (p *peerSource) Open(ctx context.Context, peer, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, error) {
	m, rc, err := p.open(ctx, peer, kind, id, statOnly)
	if err != nil {
		// The peer is told only the kind of refusal; the reason, which
		// may name this node's paths, is here.
		klog.InfoS("a source was refused to another node", "peer", peer, "kind", kind, "id", id, "err", err)
	}
	return m, rc, err
}

func (p *peerSource) open(ctx context.Context, peer, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, error) {
	d := (*Engine)(p)
	own := id // the id of this node's volume or snapshot asked for
	switch {
	case kind == SourceSnapshot && ValidSnapshotID(id), kind == SourceVolume && ValidVolumeID(id):
	case kind == SourceEpoch && ValidVolumeID(id):
		// Asked of a copy too, which is of another node's volume: the
		// records of both kinds answer it (serveEpoch).
		m, err := d.serveEpoch(peer, id)
		return m, nil, err
	case kind == SourceStandby, kind == SourceHandover, kind == SourceHanded:
		var ok bool
		if own, _, ok = parseStandbyID(id); !ok {
			return transfer.Meta{}, nil, fmt.Errorf("%w: no standby id %q can exist", transfer.ErrInvalid, id)
		}
	default:
		return transfer.Meta{}, nil, fmt.Errorf("%w: no source of kind %q and id %q can exist", transfer.ErrInvalid, kind, id)
	}
	if _, other := d.OtherNode(own); other {
		return transfer.Meta{}, nil, fmt.Errorf("%w: %s %s is not of this node", transfer.ErrNotFound, kind, id)
	}
	var m transfer.Meta
	var open func(ctx context.Context) (io.ReadCloser, error)
	var unpin func()
	var err error
	switch kind {
	case SourceSnapshot:
		m, open, unpin, err = d.serveSnapshot(id)
	case SourceStandby:
		m, open, unpin, err = d.serveStandby(peer, id)
	case SourceHandover:
		m, open, unpin, err = d.serveHandover(peer, id)
	case SourceHanded:
		if !statOnly {
			return transfer.Meta{}, nil, fmt.Errorf("%w: %s is asked, not sent", transfer.ErrInvalid, kind)
		}
		m, err = d.serveHanded(peer, id)
		open, unpin = nil, func() {}
	default:
		m, open, unpin, err = d.serveVolume(id)
	}
	if err != nil {
		return m, nil, err
	}
	if statOnly {
		unpin()
		return m, nil, nil
	}
	// A send is heavy work like a snapshot (the same archive or copy, the
	// same memory): it takes a slot, or the peer is told this node is busy
	// and retries. It never waits for one: two nodes pulling from each
	// other with every slot taken would otherwise wait on each other.
	release, ok := d.Heavy.try()
	if !ok {
		unpin()
		return m, nil, fmt.Errorf("%w: %d clones, snapshots, restores or sends are running here", transfer.ErrBusy, cap(d.Heavy))
	}
	prev := unpin
	unpin = func() { release(); prev() }
	klog.InfoS("sending a source to another node", "kind", kind, "id", id, "peer", peer, "format", m.Format, "bytes", m.Size)
	ctx, done := d.track(ctx, "send", id, m.Size)
	rc, err := open(ctx)
	if err != nil {
		done()
		unpin()
		return m, nil, err
	}
	return m, &pinnedReader{r: fsops.ProgressReader{R: rc, P: fsops.ProgressFrom(ctx)}, c: rc, release: func() { done(); unpin() }}, nil
}

// servable maps a pin's refusal onto what a peer is told.
func servable(err error, kind, id string) error {
	switch {
	case errors.Is(err, ErrNotFound):
		return fmt.Errorf("%w: %v", transfer.ErrNotFound, err)
	case errors.Is(err, ErrBusy):
		return fmt.Errorf("%w: %v", transfer.ErrBusy, err)
	}
	return fmt.Errorf("serving %s %s: %w", kind, id, err)
}

func (d *Engine) serveSnapshot(id string) (transfer.Meta, func(context.Context) (io.ReadCloser, error), func(), error) {
	unpin, err := d.pinSnapshot(id)
	if err != nil {
		return transfer.Meta{}, nil, nil, servable(err, SourceSnapshot, id)
	}
	s, ok := d.Records.Snapshots.Get(id)
	if !ok || s.Phase != PhaseReady {
		unpin()
		return transfer.Meta{}, nil, nil, fmt.Errorf("%w: snapshot %s", transfer.ErrNotFound, id)
	}
	if err := d.snapshotPresent(s); err != nil {
		unpin()
		return transfer.Meta{}, nil, nil, servable(err, SourceSnapshot, id)
	}
	m := transfer.Meta{Size: s.SizeBytes, Attrs: map[string]string{"access": s.AccessType, "layout": snapshotLayout(s)}}
	path := d.SnapshotDataPath(s)
	if s.Format == FormatImage {
		imageAttrs(&m, path)
	}
	var open func(context.Context) (io.ReadCloser, error)
	switch s.Format {
	case FormatImage:
		// Checked against its sum at rest before a byte leaves.
		m.Format, open = wireExtents, func(ctx context.Context) (io.ReadCloser, error) {
			if err := d.checkDataSum(s); err != nil {
				return nil, err
			}
			return extentsOf(ctx, path)
		}
	case FormatReflink:
		m.Format, open = WireTarZst, func(ctx context.Context) (io.ReadCloser, error) { return archiveOf(ctx, path), nil }
	default:
		m.Format, m.Attrs["sha256"] = wireTarGz, s.SHA256
		if s.Format == FormatTarZst {
			m.Format = WireTarZst
		}
		open = func(context.Context) (io.ReadCloser, error) { return os.Open(path) }
	}
	return m, open, unpin, nil
}

func (d *Engine) serveVolume(id string) (transfer.Meta, func(context.Context) (io.ReadCloser, error), func(), error) {
	v, unpin, err := d.pinVolume(id)
	if err != nil {
		return transfer.Meta{}, nil, nil, servable(err, SourceVolume, id)
	}
	m := transfer.Meta{Size: v.CapacityBytes, Attrs: map[string]string{"access": v.AccessType, "layout": layoutOf(v)}}
	if fileBacked(v) {
		imageAttrs(&m, d.VolumeDataPath(v))
	}
	format, open := d.layoutFor(v).serve(v)
	m.Format = format
	return m, open, unpin, nil
}

// archiveOf streams a tar.zst of the tree at dir, made as it is read.
func archiveOf(ctx context.Context, dir string) io.ReadCloser {
	return produce(ctx, func(ctx context.Context, w io.Writer) error {
		_, err := archive.Write(ctx, dir, w, archive.Options{Zstd: true})
		return err
	})
}

// extentsOf streams the data ranges of the file at path.
func extentsOf(ctx context.Context, path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	size, _, err := fsops.FileSize(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return produce(ctx, func(ctx context.Context, w io.Writer) error {
		defer f.Close()
		_, err := archive.WriteExtents(ctx, f, size, w)
		return err
	}), nil
}

// produce runs write in a goroutine and returns what it writes as a
// reader. Close stops the writer and waits for it, so nothing reads the
// source once its pin is released.
func produce(ctx context.Context, write func(context.Context, io.Writer) error) io.ReadCloser {
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(write(ctx, pw))
	}()
	return &producer{PipeReader: pr, cancel: cancel, done: done}
}

type producer struct {
	*io.PipeReader
	cancel func()
	done   chan struct{}
}

func (p *producer) Close() error {
	p.cancel()
	err := p.PipeReader.Close() // a writer blocked in Write returns
	<-p.done
	return err
}

// pinnedReader reads a source and, closed, releases its pin.
type pinnedReader struct {
	r       io.Reader
	c       io.Closer
	release func()
}

func (p *pinnedReader) Read(b []byte) (int, error) { return p.r.Read(b) }

func (p *pinnedReader) Close() error {
	err := p.c.Close()
	p.release()
	return err
}
