package csi

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// metrics are what /metrics shows: RPCs by method and code with their
// latency, the bytes the data path moved, and the volumes, snapshots and
// capacity right now.
type metrics struct {
	reg     *prometheus.Registry
	rpcs    *prometheus.CounterVec
	latency *prometheus.HistogramVec
	bytes   *prometheus.CounterVec
}

func newMetrics(d *Driver) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hostpath_csi_rpcs_total", Help: "CSI calls served, by method and gRPC code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "hostpath_csi_rpc_duration_seconds", Help: "Time to serve a CSI call, by method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"method"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hostpath_data_bytes_total", Help: "Bytes of volume data cloned, archived into snapshots and restored.",
		}, []string{"operation"}),
	}
	count := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	m.reg.MustRegister(m.rpcs, m.latency, m.bytes, &d.eng.Ops, d.eng.PoolCollector(), d.eng.StandbyCollector(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		count("hostpath_volumes", "Volumes on this node.", func() float64 { return float64(len(d.eng.Records.Volumes.All())) }),
		count("hostpath_snapshots", "Snapshots on this node.", func() float64 { return float64(len(d.eng.Records.Snapshots.All())) }),
		count("hostpath_state_files_awaiting_checkpoint", "Record files changed since the state journal's last checkpoint, each held open (at most 1024) so the checkpoint's fsync sees their writeback errors.", func() float64 { return float64(d.eng.Records.AwaitingCheckpoint()) }),
		count("hostpath_state_failed", "1 when the state store refuses every change until a restart (a failed sync), else 0.", func() float64 {
			if d.eng.Records.Err() != nil {
				return 1
			}
			return 0
		}),
		count("hostpath_image_freezes_stuck", "Image volumes whose file system the driver froze and could not thaw: their pods' writes wait (volume health FileSystemFrozen names them).", func() float64 { return float64(len(d.eng.StuckFreezes())) }),
		count("hostpath_image_filesystems_not_grown", "Image volumes whose file system could not grow to their size (volume health FileSystemNotGrown says why).", func() float64 { return float64(d.eng.NotGrownCount()) }),
		count("hostpath_available_capacity_bytes", "What GetCapacity would report with no parameters.", func() float64 {
			r, err := d.GetCapacity(context.Background(), nil)
			if err != nil {
				return -1
			}
			return float64(r.GetAvailableCapacity())
		}),
	)
	return m
}

// moved adds to the data-path byte counters.
func (m *metrics) moved(op string, n int64) { m.bytes.WithLabelValues(op).Add(float64(n)) }

// Registry is what an HTTP /metrics endpoint serves.
func (d *Driver) Registry() *prometheus.Registry { return d.metrics.reg }

// UnaryInterceptor is what every call of the driver's own socket goes
// through (logging, metrics); the node's control endpoint puts the
// controller's calls through it too.
func (d *Driver) UnaryInterceptor() grpc.UnaryServerInterceptor { return d.interceptor }

// interceptor counts and times every call, around the logging one.

func (d *Driver) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := logInterceptor(ctx, req, info, handler)
	d.metrics.rpcs.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	d.metrics.latency.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
	return resp, err
}

// Healthy says whether the driver is ready and its CSI socket answers.
func (d *Driver) Healthy() error {
	if !d.ready.Load() {
		return fmt.Errorf("state not loaded yet")
	}
	if err := d.eng.Records.Err(); err != nil {
		return fmt.Errorf("the state store refuses changes until the driver restarts: %w", err)
	}
	d.mu.Lock()
	sock := d.socket
	d.mu.Unlock()
	if sock == "" {
		return fmt.Errorf("CSI socket not open yet")
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		return fmt.Errorf("CSI socket %s: %w", sock, err)
	}
	c.Close()
	return nil
}
