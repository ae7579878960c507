package archive

import (
	"io"
	"runtime"

	"github.com/klauspost/compress/zstd"
	"github.com/mholt/archives"
)

// parallelZstd compresses on every core, the way `zstd -T0` does: the
// input is cut into blocks of zstdBlock bytes, each becomes a zstd frame
// of its own, compressed by a worker, and the frames are written in input
// order. Concatenated frames are one valid zstd stream (RFC 8878 3.1), so
// `zstd -d`, `tar -I zstd -xf` and any decoder read it. A single
// klauspost/compress stream encoder overlaps at most two goroutines; whole
// frames per block scale with cores, at a cost in ratio of well under 1%
// for blocks this large. The encoder is mholt/archives' Zstd
// (klauspost/compress/zstd), used through EncodeAll, which is safe for
// concurrent use.
type parallelZstd struct {
	w     io.Writer
	enc   *zstd.Encoder
	buf   []byte
	queue chan *zstdJob
	done  chan struct{}
	firstErr
}

type zstdJob struct {
	in, out []byte
	ready   chan struct{}
}

// zstdBlock is the input of one frame: large enough that starting each
// frame without history costs little, small enough that two cores get
// several blocks of a modest file.
const zstdBlock = 4 << 20

// newParallelZstd writes a zstd stream at zstd level (klauspost's
// SpeedDefault is level 3, the zstd CLI's default) to w. Memory is
// bounded: at most two blocks per core wait in the queue.
func newParallelZstd(w io.Writer, level zstd.EncoderLevel) (*parallelZstd, error) {
	n := max(runtime.GOMAXPROCS(0), 1)
	wc, err := archives.Zstd{EncoderOptions: []zstd.EOption{
		zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(n),
		zstd.WithWindowSize(zstdBlock), zstd.WithEncoderCRC(true),
	}}.OpenWriter(io.Discard)
	if err != nil {
		return nil, err
	}
	z := &parallelZstd{w: w, enc: wc.(*zstd.Encoder), buf: make([]byte, 0, zstdBlock),
		queue: make(chan *zstdJob, 2*n), done: make(chan struct{})}
	go z.writer()
	return z, nil
}

// writer emits frames in input order.
func (z *parallelZstd) writer() {
	defer close(z.done)
	for j := range z.queue {
		<-j.ready
		if z.getErr() == nil {
			if _, err := z.w.Write(j.out); err != nil {
				z.setErr(err)
			}
		}
	}
}

func (z *parallelZstd) submit() {
	j := &zstdJob{in: z.buf, ready: make(chan struct{})}
	z.queue <- j // blocks when the writer is behind: bounded memory
	go func() {
		j.out = z.enc.EncodeAll(j.in, make([]byte, 0, len(j.in)/2))
		close(j.ready)
	}()
	z.buf = make([]byte, 0, zstdBlock)
}

func (z *parallelZstd) Write(p []byte) (int, error) {
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

// Close compresses what is left and waits for every frame to be written.
func (z *parallelZstd) Close() error {
	if len(z.buf) > 0 {
		z.submit()
	}
	close(z.queue)
	<-z.done
	z.enc.Close()
	return z.getErr()
}
