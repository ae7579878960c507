package engine

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hostpath-csi/hostpath/fsops"
)

// poolCollector shows each pool on /metrics: up or down, its file
// system's size, free and used bytes (statfs at scrape time), and the
// volumes and snapshots it holds.
type poolCollector struct{ d *Engine }

var (
	poolUpDesc        = prometheus.NewDesc("hostpath_pool_up", "1 when the pool serves, 0 when it is down (its disk missing or unusable).", []string{"pool", "path"}, nil)
	poolCapacityDesc  = prometheus.NewDesc("hostpath_pool_capacity_bytes", "Size of the pool's file system.", []string{"pool"}, nil)
	poolFreeDesc      = prometheus.NewDesc("hostpath_pool_free_bytes", "Bytes of the pool's file system free for the driver (statfs f_bavail).", []string{"pool"}, nil)
	poolUsedDesc      = prometheus.NewDesc("hostpath_pool_used_bytes", "Bytes of the pool's file system in use.", []string{"pool"}, nil)
	poolVolumesDesc   = prometheus.NewDesc("hostpath_pool_volumes", "Volumes in the pool.", []string{"pool"}, nil)
	poolSnapshotsDesc = prometheus.NewDesc("hostpath_pool_snapshots", "Snapshots in the pool.", []string{"pool"}, nil)
)

// Describe implements prometheus.Collector.
func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolUpDesc, poolCapacityDesc, poolFreeDesc, poolUsedDesc, poolVolumesDesc, poolSnapshotsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	if d.Pools == nil || d.Records == nil {
		return // still starting
	}
	vols, snaps := map[*Pool]int{}, map[*Pool]int{}
	for _, v := range d.Records.Volumes.All() {
		if v.LocalPath == "" {
			vols[d.PoolOf(v.Pool)]++
		}
	}
	for _, s := range d.Records.Snapshots.All() {
		snaps[d.PoolOf(s.Pool)]++
	}
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	for _, p := range d.PoolList() {
		up := 1.0
		if d.Recheck(p).Down != nil {
			up = 0
		}
		gauge(poolUpDesc, up, p.Name, p.Paths.Root)
		gauge(poolVolumesDesc, float64(vols[p]), p.Name)
		gauge(poolSnapshotsDesc, float64(snaps[p]), p.Name)
		if up == 0 {
			continue
		}
		if fs, err := fsops.Statfs(p.Paths.Root); err == nil {
			gauge(poolCapacityDesc, float64(fs.TotalBytes), p.Name)
			gauge(poolFreeDesc, float64(fs.AvailableBytes), p.Name)
			gauge(poolUsedDesc, float64(fs.TotalBytes-fs.FreeBytes), p.Name)
		}
	}
}

// PoolCollector is the collector of the pools' metrics, for the
// protocol side's registry.
func (d *Engine) PoolCollector() prometheus.Collector { return poolCollector{d} }
