package ext4

import (
	"math/rand/v2"
	"testing"
)

// TestGeometryInvariants checks the layout of sizes e2fsck would take too
// long to read (up to 16 TiB), and of many sizes between: every group
// holds its metadata and what is allocated there, the journal's runs lie
// in data areas, in order, without overlap, and add up to its size, the
// extent leaf (where there is one) is a data block of its own, and the
// file system fits in the size asked.
func TestGeometryInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int64{MinSize, MinSize + 4095, 1 << 30, 16<<30 - 1, 16 << 30, 1 << 40, MaxSize - 1, MaxSize}
	// 2,000 random sizes of each kind (about 30 s with -race); the short
	// run (make test-unprivileged, after make test-unit ran them all as
	// root) takes a tenth.
	random := 2000
	if testing.Short() {
		random = 200
	}
	for i := 0; i < random; i++ {
		sizes = append(sizes, MinSize+r.Int64N(MaxSize-MinSize))
	}
	for i := 0; i < random; i++ {
		sizes = append(sizes, MinSize+r.Int64N(64<<30))
	}
	for _, size := range sizes {
		g, err := newGeometry(size)
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		if g.blocks*blockSize > uint64(size) || g.blocks >= 1<<32 || g.groups == 0 || uint64(g.groups-1)*blocksPerGroup >= g.blocks {
			t.Fatalf("%d bytes: %d blocks in %d groups", size, g.blocks, g.groups)
		}
		if g.inodesPer%inodesPerBlock != 0 || g.inodesPer > blocksPerGroup || uint64(g.inodesPer)*uint64(g.groups) > 1<<32-1 {
			t.Fatalf("%d bytes: %d inodes per group", size, g.inodesPer)
		}
		var total uint64
		for grp := uint32(0); grp < g.groups; grp++ {
			used, have := g.used(grp), g.groupBlocks(grp)
			if used > have || (grp == g.groups-1 && have < g.overhead(grp)+50) {
				t.Fatalf("%d bytes: group %d uses %d of %d blocks", size, grp, used, have)
			}
			total += uint64(used)
		}
		var jsum uint64
		prevEnd := g.lostFound + lostFoundSize
		for _, run := range g.journal {
			grp := uint32(run.start / blocksPerGroup)
			if run.start < g.dataStart(grp) || run.start+uint64(run.len) > groupStart(grp)+uint64(g.groupBlocks(grp)) ||
				run.start < prevEnd || run.len == 0 || run.len > 32768 {
				t.Fatalf("%d bytes: journal run %+v outside group %d's data or out of order", size, run, grp)
			}
			prevEnd = run.start + uint64(run.len)
			jsum += uint64(run.len)
		}
		if jsum != uint64(g.journalBlocks) || g.journalBlocks != defaultJournal(g.blocks) {
			t.Fatalf("%d bytes: journal runs add to %d of %d blocks", size, jsum, g.journalBlocks)
		}
		if (len(g.journal) > 4) != (g.leaf != 0) {
			t.Fatalf("%d bytes: %d journal runs, leaf %d", size, len(g.journal), g.leaf)
		}
		if g.leaf != 0 {
			grp := uint32(g.leaf / blocksPerGroup)
			if g.leaf < prevEnd || g.leaf < g.dataStart(grp) || g.leaf >= groupStart(grp)+uint64(g.groupBlocks(grp)) {
				t.Fatalf("%d bytes: extent leaf %d not a free data block", size, g.leaf)
			}
		}
		if total > g.blocks {
			t.Fatalf("%d bytes: %d blocks used of %d", size, total, g.blocks)
		}
	}
}

// TestBlocks: the blocks a file system of a size spans, which is what an
// image volume's file system is grown to: a tail too short for a group is
// left out, so a device one block past a whole group is already full.
func TestBlocks(t *testing.T) {
	const group = blocksPerGroup * blockSize
	for _, tc := range []struct {
		name string
		size int64
		want uint64
	}{
		{"four whole groups", 4 * group, 4 * blocksPerGroup},
		{"a byte short of a block more", 4*group + blockSize - 1, 4 * blocksPerGroup},
		{"one block past a group", 4*group + blockSize, 4 * blocksPerGroup},
		{"a tail too short for its metadata", 4*group + 64*blockSize, 4 * blocksPerGroup},
		{"a tail with room for data", 4*group + 2048*blockSize, 4*blocksPerGroup + 2048},
		{"the smallest", MinSize, uint64(MinSize) / blockSize},
	} {
		got, err := Blocks(tc.size)
		if err != nil || got != tc.want {
			t.Errorf("%s: Blocks(%d) = %d (%v), want %d", tc.name, tc.size, got, err, tc.want)
		}
	}
	if _, err := Blocks(MinSize - 1); err == nil {
		t.Error("Blocks below MinSize: no error")
	}
}
