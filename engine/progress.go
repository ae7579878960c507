package engine

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/fsops"
)

// An operation is a snapshot, restore or clone in flight: the leaf
// packages count its bytes and files in p (they find it in the context),
// and the driver reports them while it runs.
type operation struct {
	kind, id string // "snapshot", "restore", "clone"; the volume or snapshot written
	expected int64  // bytes it will move, 0 when not known up front
	start    time.Time
	p        fsops.Progress
}

// inflight holds the operations running now, for /metrics.
type inflight struct {
	mu  sync.Mutex
	ops map[*operation]struct{}
}

// track starts reporting an operation: every ProgressInterval a log line
// with bytes and files done, rate and (when the size is known) time left,
// and its bytes on /metrics while it runs. The returned context carries
// its Progress to the copy; done ends the reporting and, for an operation
// that ran longer than one interval, logs its totals.
func (d *Engine) track(ctx context.Context, kind, id string, expected int64) (context.Context, func()) {
	op := &operation{kind: kind, id: id, expected: expected, start: time.Now()}
	d.Ops.mu.Lock()
	d.Ops.ops[op] = struct{}{}
	d.Ops.mu.Unlock()
	stop := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(d.Config.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				op.log("in progress")
			}
		}
	}()
	return fsops.WithProgress(ctx, &op.p), sync.OnceFunc(func() {
		close(stop)
		<-finished
		d.Ops.mu.Lock()
		delete(d.Ops.ops, op)
		d.Ops.mu.Unlock()
		if time.Since(op.start) >= d.Config.ProgressInterval {
			op.log("finished")
		}
	})
}

// progressOf is the bytes moved so far and expected by the operation
// writing id, if one runs.
func (o *inflight) progressOf(id string) (done, expected int64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for op := range o.ops {
		if op.id == id {
			b, _ := op.p.Done()
			return b, op.expected, true
		}
	}
	return 0, 0, false
}

func (op *operation) log(state string) {
	b, f := op.p.Done()
	elapsed := time.Since(op.start)
	kv := []any{"operation", op.kind, "id", op.id, "bytes", b, "files", f,
		"elapsed", elapsed.Round(100 * time.Millisecond).String(), "rate", rate(b, elapsed)}
	if op.expected > 0 && state != "finished" {
		kv = append(kv, "expectedBytes", op.expected)
		if b > 0 && b < op.expected {
			left := time.Duration(float64(elapsed) * float64(op.expected-b) / float64(b))
			kv = append(kv, "estimatedLeft", left.Round(100*time.Millisecond).String())
		}
	}
	klog.InfoS(state, kv...)
}

// rate formats bytes per second in binary units, as a person reads them.
func rate(b int64, d time.Duration) string {
	if d <= 0 {
		return "0 B/s"
	}
	return formatBytes(int64(float64(b)/d.Seconds())) + "/s"
}

// The progress of operations in flight as metrics: one series per
// operation, gone when it ends.
var (
	opBytesDesc = prometheus.NewDesc("hostpath_operation_bytes_done",
		"Bytes a snapshot, restore or clone in flight has moved so far.", []string{"operation", "id"}, nil)
	opFilesDesc = prometheus.NewDesc("hostpath_operation_files_done",
		"Files a snapshot, restore or clone in flight has done so far.", []string{"operation", "id"}, nil)
	opExpectedDesc = prometheus.NewDesc("hostpath_operation_bytes_expected",
		"Bytes a snapshot, restore or clone in flight will move, where known up front.", []string{"operation", "id"}, nil)
	opSecondsDesc = prometheus.NewDesc("hostpath_operation_seconds",
		"How long a snapshot, restore or clone in flight has run.", []string{"operation", "id"}, nil)
)

func (o *inflight) Describe(ch chan<- *prometheus.Desc) {
	ch <- opBytesDesc
	ch <- opFilesDesc
	ch <- opExpectedDesc
	ch <- opSecondsDesc
}

func (o *inflight) Collect(ch chan<- prometheus.Metric) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for op := range o.ops {
		b, f := op.p.Done()
		ch <- prometheus.MustNewConstMetric(opBytesDesc, prometheus.GaugeValue, float64(b), op.kind, op.id)
		ch <- prometheus.MustNewConstMetric(opFilesDesc, prometheus.GaugeValue, float64(f), op.kind, op.id)
		ch <- prometheus.MustNewConstMetric(opSecondsDesc, prometheus.GaugeValue, time.Since(op.start).Seconds(), op.kind, op.id)
		if op.expected > 0 {
			ch <- prometheus.MustNewConstMetric(opExpectedDesc, prometheus.GaugeValue, float64(op.expected), op.kind, op.id)
		}
	}
}

// formatBytes writes a byte count in binary units (1.5 GiB).
func formatBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return strconv.FormatInt(b, 10) + " B"
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return strconv.FormatFloat(float64(b)/float64(div), 'f', 1, 64) + " " + "KMGTPE"[exp:exp+1] + "iB"
}
