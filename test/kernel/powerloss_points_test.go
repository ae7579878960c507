package kernel

import (
	"math/rand/v2"

	"github.com/hostpath-csi/hostpath/test/powerloss/logwrites"
)

// choosePoints picks most of the flush points, spread over the run, and
// after each a point between it and the next flush: a random subset of
// the writes up to the next flush, as a disk cache that reorders them
// might leave, with one write of several sectors torn (a random subset of
// its sectors). It returns them and how many have a torn write.
func choosePoints(lg *logwrites.Log, flushes []int, most int) ([]point, int) {
	chosen := flushes
	if len(flushes) > most {
		chosen = nil
		for i := 0; i < most; i++ {
			chosen = append(chosen, flushes[i*len(flushes)/most])
		}
	}
	rng := rand.New(rand.NewPCG(uint64(len(lg.Entries)), 17))
	var points []point
	next := map[int]int{}
	for i, f := range flushes {
		if i+1 < len(flushes) {
			next[f] = flushes[i+1]
		}
	}
	torn := 0
	for _, c := range chosen {
		n, ok := next[c]
		if !ok {
			n = len(lg.Entries)
		}
		points = append(points, point{upto: c, torn: -1, ackedBefore: n})
		if n-c <= 1 {
			continue
		}
		p := point{upto: c, torn: -1, ackedBefore: n}
		var multi []int
		for e := c + 1; e < n; e++ {
			if int64(lg.Entries[e].NrSectors)*lg.SectorSize > 4096 && lg.Entries[e].Flags&logwrites.Discard == 0 {
				multi = append(multi, e)
			}
			if rng.IntN(2) == 0 {
				p.extra = append(p.extra, e)
			}
		}
		if len(multi) > 0 {
			p.torn = multi[rng.IntN(len(multi))]
			torn++
		}
		points = append(points, p)
	}
	return points, torn
}
