package fsops

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// The read/write fallback reads a descriptor its caller owns. Wrapping that
// number in an *os.File lets the garbage collector close it later, when it
// may already belong to another worker's file: bytes then go to the wrong
// file or reads fail with EBADF. Many workers copy through the fallback
// while the collector runs; every byte of every copy is checked.
func TestReadWriteFallbackOwnsNoDescriptor(t *testing.T) {
	dir := t.TempDir()
	const workers, rounds = 8, 40
	stop := make(chan struct{})
	var gcWG sync.WaitGroup
	gcWG.Add(1)
	go func() { // GC pressure: finalizers run while the copies go on
		defer gcWG.Done()
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
				time.Sleep(100 * time.Microsecond)
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1<<20)
			for r := range rounds {
				if err := fallbackRound(dir, w, r, buf); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	gcWG.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func fallbackRound(dir string, w, r int, buf []byte) error {
	want := make([]byte, 64<<10+rand.IntN(64<<10))
	for i := range want {
		want[i] = byte(w*31 + r*7 + i)
	}
	sp := filepath.Join(dir, fmt.Sprintf("src-%d-%d", w, r))
	if err := os.WriteFile(sp, want, 0o600); err != nil {
		return err
	}
	src, err := os.Open(sp)
	if err != nil {
		return err
	}
	dp := filepath.Join(dir, fmt.Sprintf("dst-%d-%d", w, r))
	dst, err := os.Create(dp)
	if err != nil {
		src.Close()
		return err
	}
	p := &copyProbe{}
	p.noReflink.Store(true) // force the last resort
	p.noRange.Store(true)
	m, err := p.copyData(context.Background(), int(dst.Fd()), int(src.Fd()), int64(len(want)), false, buf, nil)
	src.Close()
	dst.Close()
	if err != nil {
		return fmt.Errorf("worker %d round %d: %w", w, r, err)
	}
	if m != CopyReadWrite {
		return fmt.Errorf("copy used %v, want the read/write fallback", m)
	}
	got, err := os.ReadFile(dp)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("worker %d round %d: copy differs from its source (%d vs %d bytes)", w, r, len(got), len(want))
	}
	os.Remove(sp)
	os.Remove(dp)
	return nil
}

func TestChangedRanges(t *testing.T) {
	const block = 4096
	full := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	tests := []struct {
		name string
		a, b []byte
		size int64
		want []Extent
	}{
		{"same", full(3*block, 'x'), full(3*block, 'x'), 3 * block, nil},
		{"one block differs", append(full(block, 'x'), full(block, 'y')...), full(2*block, 'x'), 2 * block, []Extent{{block, block}}},
		// a ends after the first MiB; b goes on with the same bytes. Past
		// a's end it reads as zeros, so the second MiB differs. Reading
		// short into a buffer that still holds the first MiB hid that.
		{"grown volume", full(1<<20, 'x'), full(2<<20, 'x'), 2 << 20, []Extent{{1 << 20, 1 << 20}}},
		// The tail is a partial block: only its real bytes count.
		{"partial last block", full(block+100, 'x'), append(full(block, 'x'), full(100, 'z')...), block + 100, []Extent{{block, 100}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			a, b := writeTemp(t, dir, "a", tc.a), writeTemp(t, dir, "b", tc.b)
			got, err := ChangedRanges(a, b, 0, tc.size, block)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func writeTemp(t *testing.T, dir, name string, data []byte) *os.File {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// A fragmented image lists hundreds of thousands of extents; merging them
// must not be quadratic (an insertion sort of 200,000 reversed extents
// takes minutes).
func TestMergeExtentsManyFragments(t *testing.T) {
	const n = 200_000
	es := make([]Extent, n)
	for i := range es {
		es[i] = Extent{int64(n-1-i) * 8192, 4096} // reversed, with gaps
	}
	start := time.Now()
	out := mergeExtents(es, 4096)
	if d := time.Since(start); d > 30*time.Second { // quadratic took minutes
		t.Fatalf("merging %d extents took %v", n, d)
	}
	if len(out) != n || out[0].Offset != 0 || out[n-1].Offset != int64(n-1)*8192 {
		t.Fatalf("merged %d extents, first %v last %v", len(out), out[0], out[len(out)-1])
	}
	// Overlapping and adjacent ones merge.
	got := mergeExtents([]Extent{{8192, 100}, {0, 4096}, {4000, 200}}, 4096)
	if fmt.Sprint(got) != fmt.Sprint([]Extent{{0, 12288}}) {
		t.Fatalf("got %v", got)
	}
}

// TestCopyStopsWithItsContext: a copy whose context is done stops before
// its next chunk with the context's error, by every method but the
// reflink (one call, nothing to stop): a copy under a freeze ends when
// the freeze's bound does, instead of running on unfrozen.
func TestCopyStopsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("data"), 1<<18) // 1 MiB
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name  string
		dense bool
		rw    bool // the read/write fallback
	}{
		{"copy_file_range of a dense file", true, false},
		{"copy_file_range over its extents", false, false},
		{"read and write", false, true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in, err := os.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			out, err := os.Create(filepath.Join(dir, fmt.Sprintf("dst%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			p := &copyProbe{}
			p.noReflink.Store(true)
			p.noRange.Store(c.rw)
			var pr Progress
			_, err = p.copyData(done, int(out.Fd()), int(in.Fd()), int64(len(data)), c.dense, make([]byte, 64<<10), &pr)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a copy with its context done: %v, want context.Canceled", err)
			}
			if b, _ := pr.Done(); b != 0 {
				t.Fatalf("%d bytes copied after the context was done", b)
			}
		})
	}
}
