package main

import (
	"strings"
	"testing"
)

func TestRows(t *testing.T) {
	in := `goos: linux
BenchmarkSnapshot/ext4/small/ours-2      	       1	  30000000 ns/op	  70.00 MB/s	    1050 archive-bytes	         4.9 peakRSS-MiB
BenchmarkSnapshot/ext4/small/tar-czf-2   	       1	 300000000 ns/op	   7.00 MB/s	    1000 archive-bytes
BenchmarkSnapshot/ext4/small/ours#01-2   	       1	  10000000 ns/op	  210.00 MB/s	    1050 archive-bytes	         5.1 peakRSS-MiB
BenchmarkSnapshot/ext4/small/tar-czf#01-2	       1	 100000000 ns/op	   21.00 MB/s	    1000 archive-bytes
BenchmarkSnapshot/ext4/small/ours#02-2   	       1	  20000000 ns/op	  105.00 MB/s	    1050 archive-bytes	         5.0 peakRSS-MiB
BenchmarkSnapshot/ext4/small/tar-czf#02-2	       1	 200000000 ns/op	   10.50 MB/s	    1000 archive-bytes
BenchmarkSnapshot/xfs/large/ours-reflink-2	       1	  1000000 ns/op	  1000.00 MB/s
BenchmarkSnapshot/xfs/large/tar-czf-2    	       1	 100000000 ns/op	   10.00 MB/s
PASS`
	rs := rows(parse(strings.NewReader(in)))
	if len(rs) != 2 {
		t.Fatalf("got %d rows: %+v", len(rs), rs)
	}
	r := rs[0]
	if r.cse != "ext4/small" || r.theirs != "tar-czf" || r.runs != 3 || r.ratio != 10 || r.peakRSS != 5.0 || r.sizeRatio != 1.05 {
		t.Fatalf("row %+v", r)
	}
	if rs[1].ours != "ours-reflink" || rs[1].ratio != 100 {
		t.Fatalf("row %+v", rs[1])
	}
	if !strings.Contains(markdown(rs), "**10.00x**") || !strings.Contains(svg(rs), "<svg") {
		t.Fatal("output")
	}
}

// TestZstdPairs: ours-zstd is compared with the zstd peers only, gzip
// with gzip, and the uncompressed ceiling with both.
func TestZstdPairs(t *testing.T) {
	in := `BenchmarkSnapshot/ext4/mixed/ours-2	1	100 ns/op
BenchmarkSnapshot/ext4/mixed/tar-czf-2	1	1000 ns/op
BenchmarkSnapshot/ext4/mixed/ours-zstd-2	1	200 ns/op
BenchmarkSnapshot/ext4/mixed/tar-cf-uncompressed-2	1	50 ns/op
BenchmarkSnapshot/ext4/mixed/tar-zstd-T0-3-2	1	100 ns/op
PASS`
	var got []string
	for _, r := range rows(parse(strings.NewReader(in))) {
		got = append(got, r.ours+" vs "+r.theirs)
	}
	want := "ours vs tar-czf, ours vs tar-cf-uncompressed, ours-zstd vs tar-cf-uncompressed, ours-zstd vs tar-zstd-T0-3"
	if strings.Join(got, ", ") != want {
		t.Fatalf("pairs: %s\nwant:  %s", strings.Join(got, ", "), want)
	}
}

// TestGoals: the rows with a goal say whether they meet it, on the table
// and in one line each, for block creates and restores from a peer too.
func TestGoals(t *testing.T) {
	in := `BenchmarkSnapshot/ext4/mixed/ours-zstd-2	1	100 ns/op
BenchmarkSnapshot/ext4/mixed/tar-zstd-T0-3-2	1	120 ns/op
BenchmarkBlockCreateAPI/size=64MiB/ours-api-2	1	100 ns/op
BenchmarkBlockCreateAPI/size=64MiB/fallocate+losetup-2	1	400 ns/op
BenchmarkRestoreFromPeer/ext4/small/tar.gz/local-2	1	90 ns/op
BenchmarkRestoreFromPeer/ext4/small/tar.gz/from-peer-2	1	100 ns/op
PASS`
	rs := rows(parse(strings.NewReader(in)))
	lines := goalLines(rs)
	for _, want := range []string{
		"goal Snapshot ext4/mixed: ours-zstd vs tar-zstd-T0-3 1.20x, goal 1.5x: SHORT by 20%",
		"goal BlockCreateAPI size=64MiB: ours-api vs fallocate+losetup 4.00x, goal 3.0x: met",
		"goal RestoreFromPeer ext4/small/tar.gz: from-peer vs local 0.90x, goal 0.8x: met",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("goal lines lack %q:\n%s", want, lines)
		}
	}
	if md := markdown(rs); !strings.Contains(md, "short by 20%") {
		t.Errorf("the table does not say the snapshot is short:\n%s", md)
	}
}
