package fsops

import (
	"context"
	"io"
	"sync/atomic"
)

// Progress counts what a long operation (a tree copy, an archive, a file
// copy) has done so far, for its caller to report while it runs. Its
// methods are safe for concurrent use; a nil *Progress counts nothing.
type Progress struct {
	bytes, files atomic.Int64
}

// AddBytes counts n more bytes done.
func (p *Progress) AddBytes(n int64) {
	if p != nil && n > 0 {
		p.bytes.Add(n)
	}
}

// AddFiles counts n more files done.
func (p *Progress) AddFiles(n int64) {
	if p != nil {
		p.files.Add(n)
	}
}

// Done returns the bytes and files counted so far.
func (p *Progress) Done() (bytes, files int64) {
	if p == nil {
		return 0, 0
	}
	return p.bytes.Load(), p.files.Load()
}

type progressKey struct{}

// WithProgress returns a context that carries p to the copies run with
// it (CopyTree, the archive package), so that their signatures stay the
// same whether or not anyone watches.
func WithProgress(ctx context.Context, p *Progress) context.Context {
	return context.WithValue(ctx, progressKey{}, p)
}

// ProgressFrom returns the Progress ctx carries, or nil.
func ProgressFrom(ctx context.Context) *Progress {
	p, _ := ctx.Value(progressKey{}).(*Progress)
	return p
}

// ProgressReader counts what is read through it.
type ProgressReader struct {
	R io.Reader
	P *Progress
}

func (r ProgressReader) Read(b []byte) (int, error) {
	n, err := r.R.Read(b)
	r.P.AddBytes(int64(n))
	return n, err
}

// ProgressWriter counts what is written through it.
type ProgressWriter struct {
	W io.Writer
	P *Progress
}

func (w ProgressWriter) Write(b []byte) (int, error) {
	n, err := w.W.Write(b)
	w.P.AddBytes(int64(n))
	return n, err
}
