package xfs

import (
	"errors"
	"testing"
)

// TestGeometryIsMkfs: the layouts mkfs.xfs 6.1 made of these sizes with
// the options the package comment names (read back with xfs_db: dblocks,
// agblocks, agcount, logblocks, logstart, fdblocks), from the floor to
// past four groups of 1 TiB, where a tail too short for a group is left
// out.
func TestGeometryIsMkfs(t *testing.T) {
	for _, tc := range []struct {
		size                    int64
		blocks                  uint64
		agBlocks, agCount, logB uint32
		logStart, free          uint64
	}{
		{300 << 20, 76800, 19200, 4, 16384, 65543, 60380},
		{301 << 20, 77056, 19264, 4, 16384, 65543, 60636},
		{512 << 20, 131072, 32768, 4, 16384, 65543, 114652},
		{1023 << 20, 261888, 65472, 4, 16384, 131079, 245468},
		{1 << 30, 262144, 65536, 4, 16384, 131079, 245724},
		{10 << 30, 2621440, 655360, 4, 16384, 2097159, 2605020},
		{17 << 30, 4456448, 1114112, 4, 16384, 4194311, 4440028},
		{100 << 30, 26214400, 6553600, 4, 16384, 16777223, 26197980},
		{1 << 40, 268435456, 67108864, 4, 131072, 134217735, 268304348},
		{4 << 40, 1073741820, 268435455, 4, 521728, 536870919, 1073220056},
		{5 << 40, 1342177275, 268435455, 5, 521728, 536870919, 1341655504},
		// A tail of 4092 blocks past four full groups: mkfs.xfs drops
		// a tail under 16 MiB (XFS_AG_MIN_BLOCKS), as it does here.
		{(1073741820 + 4092) * BlockSize, 1073741820, 268435455, 4, 521728, 536870919, 1073220056},
	} {
		g, err := newGeometry(tc.size)
		if err != nil {
			t.Fatalf("%d bytes: %v", tc.size, err)
		}
		var free uint64
		for a := uint32(0); a < g.agCount; a++ {
			for _, e := range g.layout(a).free {
				free += uint64(e.len)
			}
			free += agflFill
		}
		logStart := g.fsb(g.logAG, g.layout(g.logAG).log.start)
		if g.blocks != tc.blocks || g.agBlocks != tc.agBlocks || g.agCount != tc.agCount || g.logBlocks != tc.logB || logStart != tc.logStart || free != tc.free {
			t.Errorf("%d bytes: %d blocks, %d groups of %d, log %d at %d, %d free; mkfs.xfs made %d, %d of %d, %d at %d, %d",
				tc.size, g.blocks, g.agCount, g.agBlocks, g.logBlocks, logStart, free,
				tc.blocks, tc.agCount, tc.agBlocks, tc.logB, tc.logStart, tc.free)
		}
		if g.rootIno() != 96 {
			t.Errorf("%d bytes: root inode %d, mkfs.xfs makes 96", tc.size, g.rootIno())
		}
	}
	for _, size := range []int64{0, MinSize - 1, MaxSize + 1} {
		if _, err := newGeometry(size); !errors.Is(err, ErrSize) {
			t.Errorf("%d bytes: %v, want ErrSize", size, err)
		}
	}
}

// TestGrowTarget: what the kernel's growfs makes of a device, a tail too
// short for a group left out.
func TestGrowTarget(t *testing.T) {
	for _, tc := range []struct {
		ag       uint32
		dev, out uint64
	}{
		{65536, 4 * 65536, 4 * 65536},
		{65536, 4*65536 + 63, 4 * 65536},
		{65536, 4*65536 + 64, 4*65536 + 64},
		{65536, 3*65536 + 1000, 3*65536 + 1000},
		{0, 5, 5},
	} {
		if got := GrowTarget(tc.ag, tc.dev); got != tc.out {
			t.Errorf("GrowTarget(%d, %d) = %d, want %d", tc.ag, tc.dev, got, tc.out)
		}
	}
}
