package bench

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

var scaleVolumes = flag.Int("scale.volumes", 300, "volumes for BenchmarkScale (make scale uses 10000)")

// BenchmarkScale creates many volumes on one node and reports the create
// latency of the first and the last thousand (a tenth for small runs),
// pages through ListVolumes, and restarts the driver on the full state.
// At 10,000 volumes it holds the driver to the targets: the last thousand
// within 1.3x of the first, restart ready in under 5 s.
func BenchmarkScale(b *testing.B) {
	testutil.RequireRoot(b)
	n := *scaleVolumes
	cfg := engine.Config{DriverName: "scale", Version: "b", NodeID: "n", StateDir: filepath.Join(b.TempDir(), "state"), MaxVolumeSize: 1 << 40}
	d, err := hcsi.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	caps := []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}}
	lat := make([]time.Duration, n)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("pvc-%06d", i), VolumeCapabilities: caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}}); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	window := min(1000, max(n/10, 1))
	median := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	first, last := median(lat[:window]), median(lat[n-window:])
	ratio := float64(last) / float64(first)
	b.ReportMetric(float64(first.Microseconds())/1000, "first-ms/create")
	b.ReportMetric(float64(last.Microseconds())/1000, "last-ms/create")
	b.ReportMetric(ratio, "last/first")

	seen := map[string]bool{}
	token := ""
	for pages := 0; ; pages++ {
		r, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 500, StartingToken: token})
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range r.GetEntries() {
			if seen[e.GetVolume().GetVolumeId()] {
				b.Fatalf("ListVolumes returned %s twice", e.GetVolume().GetVolumeId())
			}
			seen[e.GetVolume().GetVolumeId()] = true
		}
		if token = r.GetNextToken(); token == "" {
			break
		}
	}
	if len(seen) != n {
		b.Fatalf("ListVolumes paged through %d of %d volumes", len(seen), n)
	}
	start := time.Now()
	if _, err := hcsi.New(cfg); err != nil {
		b.Fatal(err)
	}
	restart := time.Since(start)
	b.ReportMetric(restart.Seconds(), "restart-s")
	if n >= 10000 {
		if ratio > 1.3 {
			b.Errorf("the last %d creates took %.2fx the first %d's median latency; the target is 1.3x", window, ratio, window)
		}
		if restart > 5*time.Second {
			b.Errorf("restart with %d volumes took %v; the target is 5 s", n, restart)
		}
	}
}
