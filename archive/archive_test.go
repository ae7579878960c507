package archive

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

var ctx = context.Background()

// TestRoundTrip: everything a tree holds survives Write and Extract, for
// tar.gz and tar.zst.
func TestRoundTrip(t *testing.T) {
	for name, opts := range map[string]Options{"gzip": {}, "zstd": {Zstd: true}} {
		t.Run(name, func(t *testing.T) { roundTrip(t, opts) })
	}
}

func roundTrip(t *testing.T, opts Options) {
	testutil.RequireRoot(t) // owners and setgid bits survive only as root
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	long := filepath.Join(src, "a", string(bytes.Repeat([]byte("n"), 200)))
	os.WriteFile(long, []byte("long name"), 0o600)
	os.Chown(long, 1234, 4321)
	unix.Chmod(long, 0o2751)
	ft := unix.NsecToTimespec(1_600_000_000_000_000_007)
	unix.UtimesNanoAt(unix.AT_FDCWD, long, []unix.Timespec{ft, ft}, 0)
	f, _ := os.Create(filepath.Join(src, "sparse"))
	f.WriteAt([]byte("start"), 0)
	f.WriteAt([]byte("end"), 32<<20)
	f.Close()
	os.Symlink("../../outside", filepath.Join(src, "a", "b", "rel-link"))
	os.Link(filepath.Join(src, "sparse"), filepath.Join(src, "a", "hard"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o640)
	unix.Setxattr(filepath.Join(src, "a"), "user.k", []byte("v"), 0)
	mt := unix.NsecToTimespec(1_700_000_000_987_654_321)
	unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(src, "a"), []unix.Timespec{mt, mt}, 0)
	var buf bytes.Buffer
	var wp, rp fsops.Progress
	ws, err := Write(fsops.WithProgress(ctx, &wp), src, &buf, opts)
	if err != nil {
		t.Fatal(err)
	}
	os.Mkdir(dst, 0o755)
	rs, err := Extract(fsops.WithProgress(ctx, &rp), bytes.NewReader(buf.Bytes()), dst)
	if err != nil {
		t.Fatal(err)
	}
	// Progress counted the tar stream both ways (the writer's last zero
	// block may stay unread) and every regular file.
	wb, wf := wp.Done()
	rb, rf := rp.Done()
	if wf != ws.Files || rf != rs.Files || wb < 4<<10 || rb > wb || wb-rb > 1024 {
		t.Fatalf("progress: wrote %d bytes %d files, read %d bytes %d files; stats %+v", wb, wf, rb, rf, ws)
	}
	if ws.DataBytes > 64<<10 {
		t.Fatalf("DataBytes %d counts holes", ws.DataBytes)
	}
	ws.DataBytes = 0 // the extractor does not count it
	if ws != rs {
		t.Fatalf("wrote %+v, extracted %+v", ws, rs)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a", filepath.Base(long))); string(b) != "long name" {
		t.Fatalf("long name lost: %q %v", b, err)
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(dst, "a", filepath.Base(long)), &st)
	if st.Uid != 1234 || st.Gid != 4321 || st.Mode&0o7777 != 0o2751 || st.Mtim != ft {
		t.Fatalf("small file metadata: uid %d gid %d mode %o mtime %v", st.Uid, st.Gid, st.Mode&0o7777, st.Mtim)
	}
	unix.Stat(filepath.Join(dst, "sparse"), &st)
	if st.Size != 32<<20+3 || st.Blocks*512 > 1<<20 {
		t.Fatalf("sparse file: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
	var h unix.Stat_t
	unix.Stat(filepath.Join(dst, "a", "hard"), &h)
	if h.Ino != st.Ino {
		t.Fatal("hard link restored as a copy")
	}
	if l, _ := os.Readlink(filepath.Join(dst, "a", "b", "rel-link")); l != "../../outside" {
		t.Fatalf("symlink %q", l)
	}
	unix.Lstat(filepath.Join(dst, "a"), &st)
	if st.Mtim != mt {
		t.Fatalf("dir mtime %v want %v", st.Mtim, mt)
	}
	x := make([]byte, 8)
	if n, _ := unix.Getxattr(filepath.Join(dst, "a"), "user.k", x); string(x[:n]) != "v" {
		t.Fatal("xattr lost")
	}
	unix.Lstat(filepath.Join(dst, "fifo"), &st)
	if st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o777 != 0o640 {
		t.Fatalf("fifo mode %o", st.Mode)
	}
}

type entry struct {
	name, link string
	typ        byte
	body       string
}

func makeArchive(t testing.TB, entries []entry) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// TestBreakouts feeds archives built to write outside the destination.
// Each must fail or stay inside; nothing may appear next to dst.
func TestBreakouts(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
	}{
		{"absolute name", []entry{{name: "/tmp/evil", typ: tar.TypeReg, body: "x"}}},
		{"dot-dot", []entry{{name: "../evil", typ: tar.TypeReg, body: "x"}}},
		{"nested dot-dot", []entry{{name: "a/../../evil", typ: tar.TypeReg, body: "x"}}},
		{"file through symlink", []entry{{name: "l", link: "..", typ: tar.TypeSymlink}, {name: "l/evil", typ: tar.TypeReg, body: "x"}}},
		{"file through absolute symlink", []entry{{name: "l", link: "/", typ: tar.TypeSymlink}, {name: "l/tmp/evil", typ: tar.TypeReg, body: "x"}}},
		{"dir through symlink", []entry{{name: "l", link: "..", typ: tar.TypeSymlink}, {name: "l/evil/", typ: tar.TypeDir}}},
		{"hard link to outside", []entry{{name: "h", link: "../outside", typ: tar.TypeLink}}},
		{"hard link through symlink", []entry{{name: "l", link: "..", typ: tar.TypeSymlink}, {name: "h", link: "l/outside", typ: tar.TypeLink}}},
		{"file replacing symlink", []entry{{name: "l", link: "../outside", typ: tar.TypeSymlink}, {name: "l", typ: tar.TypeReg, body: "x"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dst := filepath.Join(base, "dst")
			os.Mkdir(dst, 0o755)
			os.WriteFile(filepath.Join(base, "outside"), []byte("precious"), 0o644)
			_, err := Extract(ctx, bytes.NewReader(makeArchive(t, tc.entries)), dst)
			entries, _ := os.ReadDir(base)
			if len(entries) != 2 {
				t.Fatalf("extraction wrote outside dst (err %v): %v", err, entries)
			}
			if b, _ := os.ReadFile(filepath.Join(base, "outside")); string(b) != "precious" {
				t.Fatal("file outside dst was changed")
			}
			if _, err := os.Stat("/tmp/evil"); err == nil {
				os.Remove("/tmp/evil")
				t.Fatal("wrote /tmp/evil")
			}
		})
	}
}

func TestDamagedArchives(t *testing.T) {
	for name, opts := range map[string]Options{"gzip": {Level: 1}, "zstd": {Zstd: true}} {
		t.Run(name, func(t *testing.T) { damagedArchives(t, opts) })
	}
}

func damagedArchives(t *testing.T, opts Options) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	os.Mkdir(src, 0o755)
	content := bytes.Repeat([]byte("0123456789"), 100000)
	os.WriteFile(filepath.Join(src, "f"), content, 0o644)
	var buf bytes.Buffer
	if _, err := Write(ctx, src, &buf, opts); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 0xff
	tests := map[string][]byte{
		"empty":     nil,
		"not gzip":  []byte("hello world, not an archive"),
		"truncated": good[:len(good)/2],
		"flipped":   flipped,
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			dst := t.TempDir()
			_, err := Extract(ctx, bytes.NewReader(data), dst)
			if errors.Is(err, ErrFormat) {
				return
			}
			// A flipped bit in deflate padding changes nothing; anything
			// else must be caught. What was restored must then be intact.
			if got, _ := os.ReadFile(filepath.Join(dst, "f")); name == "flipped" && err == nil && bytes.Equal(got, content) {
				return
			}
			t.Fatalf("got %v, want ErrFormat", err)
		})
	}
}

// FuzzExtract: no input may panic the reader or write outside dst.
func FuzzExtract(f *testing.F) {
	f.Add(makeArchive(f, []entry{{name: "a", typ: tar.TypeReg, body: "x"}}))
	f.Add(makeArchive(f, []entry{{name: "l", link: "..", typ: tar.TypeSymlink}, {name: "l/x", typ: tar.TypeReg, body: "x"}}))
	f.Add(makeArchive(f, []entry{{name: "d/", typ: tar.TypeDir}, {name: "d/h", link: "a", typ: tar.TypeLink}}))
	// What Write makes: indexed gzip members and zstd frames.
	src := f.TempDir()
	os.WriteFile(filepath.Join(src, "a"), []byte("some content"), 0o644)
	for _, opts := range []Options{{}, {Zstd: true}} {
		var buf bytes.Buffer
		if _, err := Write(ctx, src, &buf, opts); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "dst")
		os.Mkdir(dst, 0o755)
		Extract(ctx, bytes.NewReader(data), dst)
		if entries, _ := os.ReadDir(base); len(entries) != 1 {
			t.Fatalf("wrote outside dst: %v", entries)
		}
	})
}

// TestSparseIsRecorded: holes are recorded in the archive (GNU sparse 1.0),
// not stored as compressed zeros, and GNU tar restores the file exactly.
func TestSparseIsRecorded(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	os.Mkdir(src, 0o755)
	f, _ := os.Create(filepath.Join(src, "disk.img"))
	data := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	f.WriteAt(data, 1<<20)
	f.WriteAt(data, 1<<30) // 1 GiB apparent size
	f.Close()
	var buf bytes.Buffer
	if _, err := Write(ctx, src, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 64<<10 {
		t.Fatalf("archive of a 1 GiB file with 128 KiB of data is %d bytes: holes were stored", buf.Len())
	}
	archivePath := filepath.Join(base, "a.tgz")
	os.WriteFile(archivePath, buf.Bytes(), 0o600)
	ours := filepath.Join(base, "ours")
	os.Mkdir(ours, 0o755)
	if _, err := Extract(ctx, bytes.NewReader(buf.Bytes()), ours); err != nil {
		t.Fatal(err)
	}
	dirs := []string{ours}
	if testutil.HaveTools(t, "the GNU tar reading check") {
		gnu := filepath.Join(base, "gnu")
		os.Mkdir(gnu, 0o755)
		if out, err := exec.Command("tar", "xzf", archivePath, "-C", gnu).CombinedOutput(); err != nil {
			t.Fatalf("GNU tar cannot read our archive: %v %s", err, out)
		}
		dirs = append(dirs, gnu)
	}
	for _, dir := range dirs {
		var st unix.Stat_t
		p := filepath.Join(dir, "disk.img")
		unix.Stat(p, &st)
		if st.Size != 1<<30+int64(len(data)) || st.Blocks*512 > 4<<20 {
			t.Fatalf("%s: size %d, %d bytes allocated", p, st.Size, st.Blocks*512)
		}
		got := make([]byte, len(data))
		g, _ := os.Open(p)
		g.ReadAt(got, 1<<30)
		g.Close()
		if !bytes.Equal(got, data) {
			t.Fatalf("%s: data at 1 GiB differs", p)
		}
	}
}

// TestLanesBoundMemory: what a stream keeps in flight is bounded by
// unitBudget whatever GOMAXPROCS is, and on few cores is what it was (two
// jobs per core, one coder per core).
func TestLanesBoundMemory(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, procs := range []int{1, 2, 4, 16, 64, 256} {
		runtime.GOMAXPROCS(procs)
		for _, block := range []int{gzBlock, zstdBlock} {
			jobs, coders := lanes(block)
			if coders > maxCoders {
				t.Errorf("GOMAXPROCS %d: %d coders", procs, coders)
			}
			if inFlight := (jobs + 1) * 2 * block; jobs > 2 && inFlight > unitBudget+2*2*block {
				t.Errorf("GOMAXPROCS %d, %d-byte blocks: %d jobs keep %d MiB in flight", procs, block, jobs, inFlight>>20)
			}
			if procs <= 2 && (jobs != 2*procs && jobs != 2 || coders != procs) {
				t.Errorf("GOMAXPROCS %d: %d jobs, %d coders; want the pipeline of before", procs, jobs, coders)
			}
			if coders < 1 || coders > jobs {
				t.Errorf("GOMAXPROCS %d: %d coders for %d jobs", procs, coders, jobs)
			}
		}
	}
}

// TestIndexedStreams: whatever the sizes of the writes and of the input
// around block boundaries, the stream is one unit per block, standard
// readers (Go's gzip, klauspost's streaming zstd) read it as one stream,
// and the parallel reader gives back the input.
func TestIndexedStreams(t *testing.T) {
	zf, err := newZstdFrames(zstd.SpeedDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer zf.enc.Close()
	formats := []struct {
		name   string
		f      blockFormat
		block  int
		read   func(io.Reader) (io.Reader, error)
		reader func() (blockFormat, error)
	}{
		{"gzip", &gzipMembers{level: 6}, gzBlock,
			func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) },
			func() (blockFormat, error) { return &gzipMembers{}, nil }},
		{"gzip-compact", &gzipMembers{level: 6, compact: true}, gzBlock,
			func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) },
			func() (blockFormat, error) { return &gzipMembers{}, nil }},
		{"zstd", zf, zstdBlock,
			func(r io.Reader) (io.Reader, error) { return zstd.NewReader(r) },
			func() (blockFormat, error) { return newZstdDecoder() }},
	}
	for _, ft := range formats {
		for _, size := range []int{0, 1, ft.block - 1, ft.block, ft.block + 1, 3*ft.block + 12345} {
			t.Run(fmt.Sprintf("%s/%d", ft.name, size), func(t *testing.T) {
				in := make([]byte, size)
				for i := range in {
					in[i] = byte(i*7 + i/1000)
				}
				var buf bytes.Buffer
				z := newParallelWriter(&buf, ft.f, ft.block)
				for off := 0; off < len(in); {
					n := min(len(in)-off, 1+off%70000)
					z.Write(in[off : off+n])
					off += n
				}
				if err := z.Close(); err != nil {
					t.Fatal(err)
				}
				stream := buf.Bytes()
				std, err := ft.read(bytes.NewReader(stream))
				if err != nil {
					t.Fatal(err)
				}
				if out, err := io.ReadAll(std); err != nil || !bytes.Equal(out, in) {
					t.Fatalf("standard reader: round trip failed: %v", err)
				}
				rf, err := ft.reader()
				if err != nil {
					t.Fatal(err)
				}
				br := bufio.NewReader(bytes.NewReader(stream))
				start, end := rf.marks()
				if !skipMark(br, start) {
					t.Fatal("the stream does not open with the start mark")
				}
				units := 0
				for !skipMark(br, end) {
					_, err := rf.next(br, nil)
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					units++
				}
				if want := max(1, (size+ft.block-1)/ft.block); units != want {
					t.Fatalf("%d units, want %d", units, want)
				}
				pr := newParallelReader(bufio.NewReader(bytes.NewReader(stream)), rf, ft.block)
				out, err := io.ReadAll(pr)
				pr.Close()
				if err != nil || !bytes.Equal(out, in) {
					t.Fatalf("parallel reader: round trip failed: %v", err)
				}
			})
		}
	}
}

// TestEndUnit: a stream cut at any unit boundary, or at the start mark,
// is ErrFormat, and so is one that goes on after its end; a stream of an
// earlier version (units with neither mark) still reads whole; gzip and
// zstd read the marks as empty members and skippable frames.
func TestEndUnit(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), bytes.Repeat([]byte("0123456789abcdef"), 700000), 0o644)
	os.WriteFile(filepath.Join(dir, "b"), []byte("small"), 0o644)
	for _, zst := range []bool{false, true} {
		t.Run(fmt.Sprintf("zstd=%v", zst), func(t *testing.T) {
			var buf bytes.Buffer
			if _, err := Write(ctx, dir, &buf, Options{Zstd: zst}); err != nil {
				t.Fatal(err)
			}
			stream := buf.Bytes()
			var f blockFormat = &gzipMembers{}
			if zst {
				z, err := newZstdDecoder()
				if err != nil {
					t.Fatal(err)
				}
				defer z.Close()
				f = z
			}
			start, end := f.marks()
			if !bytes.HasPrefix(stream, start) || !bytes.HasSuffix(stream, end) {
				t.Fatal("the stream lacks its marks")
			}
			// Every unit boundary, found by walking the units.
			br := bufio.NewReader(bytes.NewReader(stream))
			skipMark(br, start)
			cuts := []int{len(start)}
			off := len(start)
			for !skipMark(br, end) {
				u, err := f.next(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				off += len(u)
				cuts = append(cuts, off)
			}
			if len(cuts) < 3 {
				t.Fatalf("only %d boundaries", len(cuts))
			}
			for _, c := range cuts {
				if _, err := Extract(ctx, bytes.NewReader(stream[:c]), t.TempDir()); !errors.Is(err, ErrFormat) {
					t.Fatalf("cut at %d of %d: %v, want ErrFormat", c, len(stream), err)
				}
			}
			if _, err := Extract(ctx, bytes.NewReader(append(bytes.Clone(stream), stream[len(start):cuts[1]]...)), t.TempDir()); !errors.Is(err, ErrFormat) {
				t.Fatalf("a unit after the end: %v, want ErrFormat", err)
			}
			// An earlier version's stream: the same units, no marks.
			old := stream[len(start) : len(stream)-len(end)]
			out := t.TempDir()
			if _, err := Extract(ctx, bytes.NewReader(old), out); err != nil {
				t.Fatalf("an unmarked stream: %v", err)
			}
			if got, _ := os.ReadFile(filepath.Join(out, "b")); string(got) != "small" {
				t.Fatalf("unmarked stream restored %q", got)
			}
			// The command-line tools read the marked stream.
			tool := "gzip"
			if zst {
				tool = "zstd"
			}
			if _, err := exec.LookPath(tool); err == nil {
				cmd := exec.Command(tool, "-t")
				cmd.Stdin = bytes.NewReader(stream)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s -t: %v %s", tool, err, out)
				}
			}
		})
	}
}

// TestEarlierFormats: single-stream tar.gz and tar.zst (what GNU tar and
// earlier versions of the driver write) still extract.
func TestEarlierFormats(t *testing.T) {
	tarball := func(w io.Writer) {
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5, Uid: os.Getuid(), Gid: os.Getgid()})
		tw.Write([]byte("hello"))
		tw.Close()
	}
	writers := map[string]func(io.Writer) io.WriteCloser{
		"gzip": func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) },
		"zstd": func(w io.Writer) io.WriteCloser { e, _ := zstd.NewWriter(w); return e },
	}
	for name, newW := range writers {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			w := newW(&buf)
			tarball(w)
			w.Close()
			if isGzipMember(buf.Bytes()) || isZstdUnit(buf.Bytes()) {
				t.Fatal("test stream looks indexed")
			}
			dst := t.TempDir()
			if _, err := Extract(ctx, &buf, dst); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(filepath.Join(dst, "f")); string(got) != "hello" {
				t.Fatalf("got %q", got)
			}
		})
	}
}

// TestSnapshotSymlinkSwapRace: a pod swapping a directory for a symlink
// to a host directory while its volume is archived never gets a host file
// into the archive.
func TestSnapshotSymlinkSwapRace(t *testing.T) {
	base := t.TempDir()
	host := filepath.Join(base, "host")
	os.Mkdir(host, 0o755)
	secret := []byte("host secret that must never be archived")
	os.WriteFile(filepath.Join(host, "secret"), secret, 0o600)
	src := filepath.Join(base, "vol")
	os.MkdirAll(filepath.Join(src, "d"), 0o755)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tmp := filepath.Join(src, "tmp")
			if i%2 == 0 {
				os.Symlink(host, tmp)
			} else {
				os.Mkdir(tmp, 0o755)
			}
			unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, filepath.Join(src, "d"), unix.RENAME_EXCHANGE)
			os.RemoveAll(tmp)
		}
	}()
	for i := 0; i < 100; i++ {
		var buf bytes.Buffer
		if _, err := Write(ctx, src, &buf, Options{Level: 1}); err != nil {
			continue // failing cleanly is allowed
		}
		if bytes.Contains(buf.Bytes(), []byte("host secret")) {
			t.Fatal("host file in the archive") // level 1 on 40 bytes stores them literally
		}
		dst := t.TempDir()
		Extract(ctx, bytes.NewReader(buf.Bytes()), dst)
		filepath.Walk(dst, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				if b, _ := os.ReadFile(p); bytes.Equal(b, secret) {
					t.Fatalf("host file restored at %s", p)
				}
			}
			return nil
		})
	}
	close(stop)
	<-done
}

// TestDeepTree: a 4,000-deep directory tree (paths twice PATH_MAX) is
// archived and restored, and nothing is written outside.
func TestDeepTree(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	os.Mkdir(src, 0o755)
	fd, _ := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	for i := 0; i < 4000; i++ {
		unix.Mkdirat(fd, "d", 0o755)
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	unix.Close(fd)
	var buf bytes.Buffer
	st, err := Write(ctx, src, &buf, Options{})
	if err != nil || st.Dirs != 4000 {
		t.Fatalf("archiving a 4,000-deep tree: %+v %v", st, err)
	}
	dst := filepath.Join(base, "dst")
	os.Mkdir(dst, 0o755)
	rs, err := Extract(ctx, bytes.NewReader(buf.Bytes()), dst)
	if err != nil || rs.Dirs != 4000 {
		t.Fatalf("restoring a 4,000-deep archive: %+v %v", rs, err)
	}
	if entries, _ := os.ReadDir(base); len(entries) != 2 {
		t.Fatalf("restore wrote outside: %v", entries)
	}
	os.Chmod(dst, 0o755)
	for _, d := range []string{src, dst} {
		if err := fsops.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
}

// TestZstdReadByGNUTar: GNU tar with the zstd CLI reads what Write makes
// with Zstd (several frames: one per 8 MiB block), sparse files included.
func TestZstdReadByGNUTar(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	os.MkdirAll(filepath.Join(src, "d"), 0o755)
	big := make([]byte, 20<<20) // three frames
	for i := range big {
		big[i] = byte(i * 31 / 7)
	}
	os.WriteFile(filepath.Join(src, "d", "big"), big, 0o644)
	f, _ := os.Create(filepath.Join(src, "sparse"))
	f.WriteAt([]byte("start"), 0)
	f.WriteAt([]byte("end"), 64<<20)
	f.Close()
	var buf bytes.Buffer
	if _, err := Write(ctx, src, &buf, Options{Zstd: true}); err != nil {
		t.Fatal(err)
	}
	if !isZstdUnit(buf.Bytes()) {
		t.Fatalf("archive starts with %x, not a pzstd skippable frame", buf.Bytes()[:12])
	}
	if buf.Len() > 1<<20 {
		t.Fatalf("archive of 20 MiB of a repeating pattern and a sparse file is %d bytes", buf.Len())
	}
	if !testutil.HaveTools(t, "the GNU tar reading check") {
		return
	}
	archivePath := filepath.Join(base, "a.tar.zst")
	os.WriteFile(archivePath, buf.Bytes(), 0o600)
	gnu := filepath.Join(base, "gnu")
	os.Mkdir(gnu, 0o755)
	if out, err := exec.Command("tar", "-I", "zstd", "-xf", archivePath, "-C", gnu).CombinedOutput(); err != nil {
		t.Fatalf("GNU tar cannot read our tar.zst: %v %s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(gnu, "d", "big")); !bytes.Equal(got, big) {
		t.Fatal("GNU tar read different content")
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(gnu, "sparse"), &st)
	if st.Size != 64<<20+3 || st.Blocks*512 > 1<<20 {
		t.Fatalf("sparse file through GNU tar: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
}

// TestSparseBombRestoresFast: a 256 GiB file of holes with a little data
// (a tenant's truncate -s) archives small and restores in under 2 s, its
// holes skipped, not read as zeros: before, the tar reader handed the
// extractor 256 GiB of zeros to scan.
func TestSparseBombRestoresFast(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	os.Mkdir(src, 0o755)
	f, err := os.Create(filepath.Join(src, "bomb"))
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("tenant data "), 1000)
	for _, off := range []int64{0, 100 << 30, 256<<30 - int64(len(data)) - 4096} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(256 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var buf bytes.Buffer
	if _, err := Write(ctx, src, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "dst")
	os.Mkdir(dst, 0o755)
	start := time.Now()
	if _, err := Extract(ctx, bytes.NewReader(buf.Bytes()), dst); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "bomb"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 256<<30 || st.Blocks*512 > 1<<20 {
		t.Fatalf("restored: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
	g, _ := os.Open(filepath.Join(dst, "bomb"))
	defer g.Close()
	for _, off := range []int64{0, 100 << 30, 256<<30 - int64(len(data)) - 4096} {
		got := make([]byte, len(data))
		if _, err := g.ReadAt(got, off); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("data at %d differs: %v", off, err)
		}
	}
	if took > 20*time.Second { // milliseconds here; minutes before the fix
		t.Fatalf("256 GiB of holes took %v to restore, more than 20 s", took)
	}
	t.Logf("256 GiB file, %d bytes archived, restored in %v", buf.Len(), took)
}

// TestExtractUntrusted: an archive another node serves restores without
// its device nodes, setuid and setgid bits and file capabilities (a node
// taken could plant them for another tenant); Extract of the driver's
// own keeps them all.
func TestExtractUntrusted(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	src := filepath.Join(base, "src")
	os.Mkdir(src, 0o755)
	if err := unix.Mknod(filepath.Join(src, "sda"), unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(src, "su")
	os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755)
	if err := os.Chmod(prog, 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	// cap_setuid+ep, as setcap writes it (VFS_CAP_REVISION_2).
	capv := []byte{0x01, 0x00, 0x00, 0x02, 0x80, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0}
	capOK := unix.Setxattr(prog, "security.capability", capv, 0) == nil
	var buf bytes.Buffer
	if _, err := Write(ctx, src, &buf, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		extract func(context.Context, io.Reader, string) (Stats, error)
		kept    bool
	}{{"own", Extract, true}, {"untrusted", ExtractUntrusted, false}} {
		dst := filepath.Join(base, c.name)
		os.Mkdir(dst, 0o755)
		st, err := c.extract(ctx, bytes.NewReader(buf.Bytes()), dst)
		if err != nil {
			t.Fatal(err)
		}
		_, derr := os.Lstat(filepath.Join(dst, "sda"))
		fi, err := os.Stat(filepath.Join(dst, "su"))
		if err != nil {
			t.Fatal(err)
		}
		suid := fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0
		n, _ := unix.Getxattr(filepath.Join(dst, "su"), "security.capability", make([]byte, 64))
		if (derr == nil) != c.kept || suid != c.kept || (capOK && (n > 0) != c.kept) {
			t.Fatalf("%s: device node kept %v, setuid kept %v, capability %d bytes; want kept=%v", c.name, derr == nil, suid, n, c.kept)
		}
		if _, err := os.Lstat(filepath.Join(dst, "fifo")); err != nil {
			t.Fatalf("%s: the fifo was left out: %v", c.name, err)
		}
		if !c.kept && st.SkippedDevices != 1 {
			t.Fatalf("untrusted: %d devices skipped, want 1", st.SkippedDevices)
		}
	}
}
