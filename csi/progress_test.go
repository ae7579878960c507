package csi

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2"
)

// opSeries returns the in-flight series of one metric for an operation
// kind, by id.
func opSeries(t *testing.T, d *Driver, name, kind string) map[string]float64 {
	t.Helper()
	mfs, err := d.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["operation"] == kind {
				out[labels["id"]] = value(m)
			}
		}
	}
	return out
}

func value(m *dto.Metric) float64 { return m.GetGauge().GetValue() }

// TestProgressReported: a snapshot and a restore that run longer than the
// progress interval log their bytes, files and rate at that interval, and
// /metrics shows their bytes done while they run and nothing after.
func TestProgressReported(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	klog.SetLogger(funcr.New(func(prefix, args string) {
		mu.Lock()
		lines = append(lines, args)
		mu.Unlock()
	}, funcr.Options{}))
	t.Cleanup(klog.ClearLogger)
	logged := func(kind, state string) []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for _, l := range lines {
			if strings.Contains(l, `"msg"="`+state+`"`) && strings.Contains(l, `"operation"="`+kind+`"`) {
				out = append(out, l)
			}
		}
		return out
	}

	cfg := testConfig(t)
	cfg.ProgressInterval = 10 * time.Millisecond
	d := newDriver(t, cfg)
	v := mustCreate(t, d, "pvc-progress", 1<<30)
	// Incompressible data, so that the archive takes a while on any machine.
	data := make([]byte, 96<<20)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(data)
	for i := 0; i < 4; i++ {
		if err := os.WriteFile(filepath.Join(volumeDir(d, v.GetVolumeId()), "f"+string(rune('0'+i))), data[i*24<<20:(i+1)*24<<20], 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// watch polls /metrics while op runs and returns the largest bytes
	// done it saw for the operation.
	watch := func(kind string, op func() error) float64 {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- op() }()
		var most float64
		for {
			select {
			case err := <-errc:
				if err != nil {
					t.Fatal(err)
				}
				if left := opSeries(t, d, "hostpath_operation_bytes_done", kind); len(left) != 0 {
					t.Fatalf("%s finished, yet /metrics still shows %v", kind, left)
				}
				return most
			case <-time.After(2 * time.Millisecond):
				for _, b := range opSeries(t, d, "hostpath_operation_bytes_done", kind) {
					most = max(most, b)
				}
			}
		}
	}

	var snapID string
	// It is answered once cut, not ready; it is done once a retry
	// answers it ready.
	most := watch("snapshot", func() error {
		for {
			s, err := d.CreateSnapshot(ctx, snapReq("snap-progress", v.GetVolumeId(), nil))
			if err != nil || s.GetSnapshot().GetReadyToUse() {
				snapID = s.GetSnapshot().GetSnapshotId()
				return err
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	if most <= 0 || most > 97<<20 {
		t.Fatalf("snapshot: /metrics showed at most %v bytes done of 96 MiB", most)
	}
	if l := logged("snapshot", "in progress"); len(l) == 0 || !strings.Contains(l[len(l)-1], `"id"="`+snapID+`"`) || !strings.Contains(l[len(l)-1], "/s") {
		t.Fatalf("snapshot progress lines: %q", l)
	}
	if l := logged("snapshot", "finished"); len(l) != 1 || !strings.Contains(l[0], `"files"=4`) {
		t.Fatalf("snapshot finished lines: %q", l)
	}

	most = watch("restore", func() error {
		_, err := d.CreateVolume(ctx, fromSnapshot("pvc-progress-restore", snapID, 1<<30))
		return err
	})
	if most <= 0 {
		t.Fatalf("restore: /metrics never showed bytes done")
	}
	// The snapshot's size is known, so the restore estimates what is left.
	if l := logged("restore", "in progress"); len(l) == 0 || !strings.Contains(strings.Join(l, "\n"), `"expectedBytes"=`) {
		t.Fatalf("restore progress lines: %q", l)
	}
}
