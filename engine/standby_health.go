package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// What a primary knows of its volumes' standbys, and what /metrics and
// volume health say of both ends.

// standbyServed is what a primary knows of a volume's standby: the
// generation it last said it holds and when that generation was cut, and
// the bytes sent to it.
type standbyServed struct {
	held    uint64
	heldCut time.Time
	asked   time.Time
	sent    int64
}

// noteAsked records that volume id's standby asked for the changes since
// generation held, whose cut (in dir) tells when it was made.
func (d *Engine) noteAsked(id, dir string, held uint64) {
	var cut time.Time
	if fi, err := os.Stat(filepath.Join(dir, cutName(held))); err == nil && held > 0 {
		cut = fi.ModTime()
	}
	d.standby.mu.Lock()
	defer d.standby.mu.Unlock()
	if d.standby.served == nil {
		d.standby.served = map[string]standbyServed{}
	}
	s := d.standby.served[id]
	s.held, s.asked = held, time.Now()
	if !cut.IsZero() {
		s.heldCut = cut
	}
	d.standby.served[id] = s
}

// noteSent adds n bytes sent to volume id's standby.
func (d *Engine) noteSent(id string, n int64) {
	d.standby.mu.Lock()
	defer d.standby.mu.Unlock()
	s := d.standby.served[id]
	s.sent += n
	d.standby.served[id] = s
}

// StandbyBehind says, for a volume with a standby, why its standby is
// more than three intervals behind (nil when it is not, or the volume has
// none): the age of the newest generation the standby said it holds, or,
// until it has said so since this driver started, the time since then.
func (d *Engine) StandbyBehind(v VolumeRecord) error {
	if v.Standby == "" {
		return nil
	}
	_, every, _ := CheckStandbyParams(v.Parameters)
	d.standby.mu.Lock()
	s, ok := d.standby.served[v.ID]
	d.standby.mu.Unlock()
	ref, what := d.started, "since this driver started"
	if v.CreatedAt.After(ref) {
		ref, what = v.CreatedAt, "since the volume was made"
	}
	if ok && !s.heldCut.IsZero() {
		ref, what = s.heldCut, fmt.Sprintf("its newest generation (%d) was cut", s.held)
	}
	if age := time.Since(ref); age > 3*every {
		asked := "it has not asked since this driver started"
		if ok {
			asked = fmt.Sprintf("it last asked %s ago", time.Since(s.asked).Round(time.Second))
		}
		return fmt.Errorf("the standby copy on node %s is %s behind (%s; three intervals are %s): it is unreachable or cannot keep up; %s", v.Standby, age.Round(time.Second), what, 3*every, asked)
	}
	return nil
}

var (
	standbySentDesc = prometheus.NewDesc("hostpath_standby_sent_bytes_total", "Bytes of changed blocks this node sent to the standby copy of its volume since it started.", []string{"volume", "standby"}, nil)
	standbyLagDesc  = prometheus.NewDesc("hostpath_standby_lag_seconds", "Age of the newest generation the standby of this node's volume said it holds (since the driver started, until it has said).", []string{"volume", "standby"}, nil)
	copyAgeDesc     = prometheus.NewDesc("hostpath_standby_copy_age_seconds", "Age of the newest generation of a copy this node keeps of another node's volume (-1 before its first since start).", []string{"volume", "primary"}, nil)
	copyBytesDesc   = prometheus.NewDesc("hostpath_standby_received_bytes_total", "Bytes of changed blocks this node received for a copy it keeps since it started.", []string{"volume", "primary"}, nil)
)

type standbyCollector struct{ d *Engine }

// StandbyCollector shows both ends of standby copies on /metrics.
func (d *Engine) StandbyCollector() prometheus.Collector { return standbyCollector{d} }

// Describe implements prometheus.Collector.
func (c standbyCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{standbySentDesc, standbyLagDesc, copyAgeDesc, copyBytesDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c standbyCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	if d.Records == nil {
		return
	}
	d.standby.mu.Lock()
	served := make(map[string]standbyServed, len(d.standby.served))
	for k, v := range d.standby.served {
		served[k] = v
	}
	status := make(map[string]StandbyStatus, len(d.standby.status))
	for k, v := range d.standby.status {
		status[k] = v
	}
	d.standby.mu.Unlock()
	for _, v := range d.Records.Volumes.All() {
		if v.Standby == "" {
			continue
		}
		s := served[v.ID]
		ref := d.started
		if !s.heldCut.IsZero() {
			ref = s.heldCut
		}
		ch <- prometheus.MustNewConstMetric(standbySentDesc, prometheus.CounterValue, float64(s.sent), v.ID, v.Standby)
		ch <- prometheus.MustNewConstMetric(standbyLagDesc, prometheus.GaugeValue, time.Since(ref).Seconds(), v.ID, v.Standby)
	}
	for _, s := range d.Records.Standbys.All() {
		st := status[s.Volume]
		age := -1.0
		if !st.Made.IsZero() {
			age = time.Since(st.Made).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(copyAgeDesc, prometheus.GaugeValue, age, s.Volume, s.Primary)
		ch <- prometheus.MustNewConstMetric(copyBytesDesc, prometheus.CounterValue, float64(st.Bytes), s.Volume, s.Primary)
	}
}
