package kernel

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/hostpath-csi/hostpath/test/kernel/plan"
	"github.com/hostpath-csi/hostpath/test/powerloss/logwrites"
)

// envSample, when set to N, replays a fixed sample instead of the full
// run (make test-powerloss-sample, which CI runs): N flush points spread
// over the run, plus every point around the places where a crash is most
// likely to lose something (mustPoints), and one recovery per file system.
const envSample = "HOSTPATH_POWERLOSS_POINTS"

// samplePoints is the sample's size from envSample, 0 for the full run.
func samplePoints() int {
	n, err := strconv.Atoi(os.Getenv(envSample))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// aroundEach is how many flush points mustPoints takes in each window
// it covers, spread over it, besides the first flush after its end.
const aroundEach = 2

// mustPoints are the flush points a sample always replays: those in the
// windows where the journal checkpoints (between two ops whose recorded
// epochs differ: the recorder notes the journal's epoch with every op)
// and where the driver is killed and starts again (before each restart,
// among them the kill inside a freeze, whose window holds the freeze
// record, the kill and the thaw at start) and where a standby copy's pull
// commits its generation (standby-gen), up to aroundEach spread over
// each window and the first flush after it.
func mustPoints(ops []plan.Op, markAt map[string]int, flushes []int) []int {
	var must []int
	prevMark, lastEpoch := -1, uint64(0) // epochs start at 1
	for _, op := range ops {
		at, ok := markAt[op.Mark]
		if !ok {
			continue
		}
		window := op.Kind == "restart" || op.Kind == "recovered" || op.Kind == "standby-gen"
		if op.Epoch != 0 { // every op of a recording names the epoch after it
			window = window || lastEpoch != 0 && op.Epoch != lastEpoch
			lastEpoch = op.Epoch
		}
		if window {
			lo, _ := slices.BinarySearch(flushes, prevMark+1)
			hi, _ := slices.BinarySearch(flushes, at)
			in := flushes[lo:hi]
			if len(in) <= aroundEach {
				must = append(must, in...)
			} else {
				for i := range aroundEach {
					must = append(must, in[i*len(in)/aroundEach])
				}
				must = append(must, in[len(in)-1])
			}
			if hi < len(flushes) {
				must = append(must, flushes[hi])
			}
		}
		prevMark = at
	}
	slices.Sort(must)
	return slices.Compact(must)
}

// choosePoints picks most of the flush points, spread over the run, and
// the must points, and after each a point between it and the next flush:
// a random subset of the writes up to the next flush, as a disk cache
// that reorders them might leave, with one write of several sectors torn
// (a random subset of its sectors). It returns them and how many have a
// torn write.
func choosePoints(lg *logwrites.Log, flushes []int, most int, must []int) ([]point, int) {
	chosen := flushes
	if len(flushes) > most {
		chosen = nil
		for i := 0; i < most; i++ {
			chosen = append(chosen, flushes[i*len(flushes)/most])
		}
		chosen = append(chosen, must...)
		slices.Sort(chosen)
		chosen = slices.Compact(chosen)
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

// TestMustPoints checks which flushes a sample always replays: those in
// a kill's window and in a checkpoint's, and the first after each.
func TestMustPoints(t *testing.T) {
	flushes := []int{2, 5, 9, 12, 20, 31, 40, 41, 42, 43, 44, 45, 46, 47, 48, 60}
	cases := []struct {
		name string
		ops  []plan.Op
		want []int
	}{
		{"no window", []plan.Op{{Mark: "a", Kind: "create"}, {Mark: "b", Kind: "epoch", Epoch: 1}}, nil},
		{"a kill", []plan.Op{{Mark: "a", Kind: "create"}, {Mark: "b", Kind: "restart"}}, []int{9, 12, 20}},
		{"a checkpoint", []plan.Op{{Mark: "a", Kind: "epoch", Epoch: 1}, {Mark: "b", Kind: "epoch", Epoch: 1}, {Mark: "c", Kind: "epoch", Epoch: 2}},
			[]int{20, 43, 48, 60}},
		{"a checkpoint between two creates", []plan.Op{{Mark: "a", Kind: "create", Epoch: 3}, {Mark: "b", Kind: "create", Epoch: 4}}, []int{9, 12, 20}},
	}
	markAt := map[string]int{"a": 6, "b": 15, "c": 50}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := mustPoints(c.ops, markAt, flushes); !slices.Equal(got, c.want) {
				t.Errorf("mustPoints = %v, want %v", got, c.want)
			}
		})
	}
}
