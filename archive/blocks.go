package archive

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
)

// A snapshot's compressed stream is a sequence of units, each the
// compressed form of one block of the tar stream, each decodable on its
// own and each saying its own length before its data: a gzip member with
// its length in an extra field (like BGZF), or a zstd frame after a
// skippable frame holding its length (like pzstd). Any gzip or zstd
// reader reads the sequence as one stream; ours finds the units without
// decoding them and decodes them on every core, which is what makes a
// restore faster than `tar xzf`, whose single gzip stream can only be
// inflated on one core.

// blockFormat frames and unframes the units of one compression format.
type blockFormat interface {
	// encode returns the unit holding in, appended to dst.
	encode(dst, in []byte) ([]byte, error)
	// next reads the next unit whole from r into buf (grown if need be),
	// or returns io.EOF at the clean end of the stream.
	next(r *bufio.Reader, buf []byte) ([]byte, error)
	// decode returns the block a unit holds, appended to dst.
	decode(dst, unit []byte) ([]byte, error)
	// marks are the exact bytes of the unit that opens a stream and of
	// the one that ends it: each a valid empty unit of the compression
	// format (an empty gzip member, a skippable zstd frame), so other
	// readers pass over them. A stream that opens with the start mark
	// must end with the end mark: without it, a cut at a unit boundary
	// that is also a tar header boundary would read as a shorter, valid
	// archive. Streams of earlier versions have neither and are read as
	// they are.
	marks() (start, end []byte)
}

// firstErr keeps the first error of a pipeline whose goroutines may
// each fail.
type firstErr struct {
	mu  sync.Mutex
	err error
}

func (f *firstErr) setErr(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

func (f *firstErr) getErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// buffers keeps blocks for reuse. A restore or snapshot moves hundreds of
// megabytes through blocks of a few: allocating each anew costs page
// faults and zeroing of fresh memory (measured: a large-file restore took
// twice as long in a process whose heap had room to shrink).
type buffers chan []byte

func newBuffers(n int) buffers { return make(buffers, n) }

// get returns an empty buffer of at least n bytes' capacity.
func (b buffers) get(n int) []byte {
	select {
	case buf := <-b:
		if cap(buf) >= n {
			return buf[:0]
		}
	default:
	}
	return make([]byte, 0, n)
}

// put keeps buf for a later get, or drops it when enough are kept.
func (b buffers) put(buf []byte) {
	if cap(buf) == 0 {
		return
	}
	select {
	case b <- buf[:0]:
	default:
	}
}

type blockJob struct {
	in, out []byte
	err     error
	ready   chan struct{}
}

// parallelWriter cuts its input into blocks of a fixed size, encodes
// them on every core and writes the units in input order. Memory is
// bounded by lanes: at most two blocks per core, and unitBudget, are in
// flight.
type parallelWriter struct {
	w     io.Writer
	f     blockFormat
	block int
	buf   []byte
	queue chan *blockJob
	sem   chan struct{}
	done  chan struct{}
	units int
	ins   buffers // blocks of input
	outs  buffers // encoded units
	firstErr
}

// unitBudget bounds the bytes one stream keeps in flight, whatever the
// number of cores: each job queued or being coded holds a block and a unit
// of about its size. Before, a stream kept up to three jobs per core, so a
// zstd restore (8 MiB blocks) took about 48 MiB per core: 1.5 GiB on 32
// cores, times the restores that run at once.
const unitBudget = 64 << 20

// maxCoders bounds the units one stream codes at once: with the restores
// and snapshots that run side by side (--max-heavy-operations) that is
// enough to keep a large node's cores busy, and each coder holds its own
// state (a zstd decoder's window, a deflate writer's tables).
const maxCoders = 8

// lanes sizes the pipeline of a stream of block-sized units: how many code
// at once (one per core, up to maxCoders) and how many jobs may be in
// flight (two per coder, as unitBudget allows, at least two). On two cores
// it is the pipeline of before; from eight (four for zstd's 8 MiB blocks)
// it no longer grows.
func lanes(block int) (jobs, coders int) {
	coders = min(max(runtime.GOMAXPROCS(0), 1), maxCoders)
	jobs = min(2*coders, max(2, unitBudget/(2*block)))
	return jobs, min(coders, jobs)
}

func newParallelWriter(w io.Writer, f blockFormat, block int) *parallelWriter {
	jobs, coders := lanes(block)
	z := &parallelWriter{w: w, f: f, block: block, buf: make([]byte, 0, block),
		queue: make(chan *blockJob, jobs), sem: make(chan struct{}, coders), done: make(chan struct{}),
		ins: newBuffers(jobs + 1), outs: newBuffers(jobs + 1)}
	start, _ := f.marks()
	if _, err := w.Write(start); err != nil {
		z.setErr(err)
	}
	go z.writer()
	return z
}

// writer emits units in input order.
func (z *parallelWriter) writer() {
	defer close(z.done)
	for j := range z.queue {
		<-j.ready
		if j.err != nil {
			z.setErr(j.err)
		}
		if z.getErr() == nil {
			if _, err := z.w.Write(j.out); err != nil {
				z.setErr(err)
			}
		}
		z.outs.put(j.out)
	}
}

func (z *parallelWriter) submit() {
	j := &blockJob{in: z.buf, ready: make(chan struct{})}
	z.queue <- j // blocks when the writer is behind: bounded memory
	z.sem <- struct{}{}
	go func() {
		j.out, j.err = z.f.encode(z.outs.get(len(j.in)/2), j.in)
		z.ins.put(j.in)
		<-z.sem
		close(j.ready)
	}()
	z.buf = z.ins.get(z.block)
	z.units++
}

func (z *parallelWriter) Write(p []byte) (int, error) {
	if err := z.getErr(); err != nil {
		return 0, err
	}
	n := len(p)
	for len(p) > 0 {
		m := copy(z.buf[len(z.buf):cap(z.buf)], p)
		z.buf = z.buf[:len(z.buf)+m]
		p = p[m:]
		if len(z.buf) == cap(z.buf) {
			z.submit()
		}
	}
	return n, nil
}

// Close encodes what is left and waits for every unit to be written. An
// empty input still gives one (empty) unit: an empty file is not a valid
// gzip stream. Close does not close w.
func (z *parallelWriter) Close() error {
	if len(z.buf) > 0 || z.units == 0 {
		z.submit()
	}
	close(z.queue)
	<-z.done
	if err := z.getErr(); err != nil {
		return err
	}
	_, end := z.f.marks()
	_, err := z.w.Write(end)
	return err
}

// parallelReader reads units in order on one goroutine (the underlying
// reader is read by nothing else while it runs) and decodes them on every
// core; Read returns the blocks in order. Memory is bounded like the
// writer's.
type parallelReader struct {
	f     blockFormat
	queue chan *blockJob
	sem   chan struct{}
	stop  chan struct{}
	ended chan struct{}
	cur   []byte // what is left of whole
	whole []byte
	err   error
	free  buffers // blocks Read is done with, for the next decodes
	units buffers // units decoded, for the next reads
}

// errTooLarge: a unit says it is larger than any unit the writer makes.
var errTooLarge = errors.New("unit larger than the format allows")

// readUnit reads, into buf (grown if need be), a unit that starts with
// prefix and a little-endian uint32 length right after it; the unit's
// whole size is that length plus extra, between least and most. It
// returns io.EOF at the clean end of the stream and errNotUnit when the
// stream does not start with prefix.
func readUnit(r *bufio.Reader, buf, prefix []byte, extra, least, most int) ([]byte, error) {
	head, err := r.Peek(len(prefix) + 4)
	if len(head) == 0 && errors.Is(err, io.EOF) {
		return nil, io.EOF
	}
	if err != nil {
		return nil, unexpected(err)
	}
	if !bytes.HasPrefix(head, prefix) {
		return nil, errNotUnit
	}
	n := int(binary.LittleEndian.Uint32(head[len(prefix):])) + extra
	if n < least || n > most {
		return nil, fmt.Errorf("%w: unit of %d bytes", errTooLarge, n)
	}
	unit := slices.Grow(buf[:0], n)[:n]
	if _, err := io.ReadFull(r, unit); err != nil {
		return nil, unexpected(err)
	}
	return unit, nil
}

// errNotUnit: the stream goes on with something that is not a unit of
// its format.
var errNotUnit = errors.New("not a unit of an indexed stream")

// unexpected turns an early end into ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func newParallelReader(r *bufio.Reader, f blockFormat, block int) *parallelReader {
	jobs, coders := lanes(block)
	z := &parallelReader{f: f, queue: make(chan *blockJob, jobs), sem: make(chan struct{}, coders),
		stop: make(chan struct{}), ended: make(chan struct{}), free: newBuffers(jobs + 1), units: newBuffers(jobs + 1)}
	go z.reader(r)
	return z
}

// errNoEnd: a stream that opened with the start mark ended without the
// end mark, or went on after it.
var errNoEnd = errors.New("the stream was cut: its end unit is missing or not last")

// skipMark consumes mark if the stream goes on with it.
func skipMark(r *bufio.Reader, mark []byte) bool {
	head, _ := r.Peek(len(mark))
	if !bytes.Equal(head, mark) {
		return false
	}
	_, _ = r.Discard(len(mark)) // Peek just returned these bytes: they are buffered
	return true
}

func (z *parallelReader) reader(r *bufio.Reader) {
	defer close(z.ended)
	defer close(z.queue)
	start, end := z.f.marks()
	marked := skipMark(r, start)
	for units := 0; ; units++ {
		select {
		case <-z.stop:
			return
		default:
		}
		var unit []byte
		var err error
		if marked && skipMark(r, end) {
			err = io.EOF
			if _, perr := r.Peek(1); perr != io.EOF {
				err = errNoEnd
			}
		} else {
			unit, err = z.f.next(r, z.units.get(0))
			if errors.Is(err, io.EOF) && marked {
				err = errNoEnd
			}
		}
		if errors.Is(err, io.EOF) && units == 0 {
			err = io.ErrUnexpectedEOF
		}
		if errors.Is(err, io.EOF) {
			return
		}
		j := &blockJob{in: unit, err: err, ready: make(chan struct{})}
		select {
		case z.queue <- j:
		case <-z.stop:
			return
		}
		if err != nil {
			close(j.ready)
			return
		}
		z.sem <- struct{}{}
		go func() {
			j.out, j.err = z.f.decode(z.free.get(0), j.in)
			z.units.put(j.in)
			<-z.sem
			close(j.ready)
		}()
	}
}

func (z *parallelReader) Read(p []byte) (int, error) {
	for len(z.cur) == 0 {
		if z.err != nil {
			return 0, z.err
		}
		j, ok := <-z.queue
		if !ok {
			z.err = io.EOF
			continue
		}
		<-j.ready
		if j.err != nil {
			z.err = formatErr(j.err)
			continue
		}
		z.cur, z.whole = j.out, j.out
	}
	n := copy(p, z.cur)
	z.advance(n)
	return n, nil
}

// advance consumes n bytes of the current block and recycles it when it
// is used up.
func (z *parallelReader) advance(n int) {
	z.cur = z.cur[n:]
	if len(z.cur) == 0 && z.whole != nil {
		z.free.put(z.whole)
		z.cur, z.whole = nil, nil
	}
}

// WriteTo saves a copy per Read when the consumer takes whole blocks.
func (z *parallelReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if len(z.cur) == 0 {
			if _, err := z.Read(nil); err != nil {
				if errors.Is(err, io.EOF) {
					return total, nil
				}
				return total, err
			}
		}
		n, err := w.Write(z.cur)
		total += int64(n)
		z.advance(n)
		if err != nil {
			return total, err
		}
	}
}

// Close stops the reading goroutine and waits for it, so the underlying
// reader is the caller's again when Close returns.
func (z *parallelReader) Close() error {
	close(z.stop)
	for j := range z.queue {
		<-j.ready
	}
	<-z.ended
	if c, ok := z.f.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
