package engine

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/engine/store"
)

// TestCreateProtocol: the one create protocol, for each way it ends. A
// made record is ready; a make that fails has its data undone and its
// record dropped; an undo that fails is logged and leaves the record
// creating for the next start; a record with nothing to make is written
// once, ready.
func TestCreateProtocol(t *testing.T) {
	var logs bytes.Buffer
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	fs.Set("logtostderr", "false")
	klog.SetOutput(&logs)
	defer func() { klog.SetOutput(os.Stderr); fs.Set("logtostderr", "true") }()
	boom := errors.New("make failed")
	for _, tc := range []struct {
		name     string
		make     func(VolumeRecord) (VolumeRecord, error)
		undoErr  error
		phase    string // the record's phase after; "" for no record
		undone   bool
		wantLogs string
	}{
		{"made", func(v VolumeRecord) (VolumeRecord, error) { v.Phase = PhaseReady; return v, nil }, nil, PhaseReady, false, ""},
		{"make fails", func(VolumeRecord) (VolumeRecord, error) { return VolumeRecord{}, boom }, nil, "", true, ""},
		{"make and undo fail", func(VolumeRecord) (VolumeRecord, error) { return VolumeRecord{}, boom }, errors.New("undo failed"), PhaseCreating, true, "cleaning up after a failed create"},
		{"nothing to make", nil, nil, PhaseReady, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			st, err := store.Open(t.TempDir(), store.IDRules{Volume: ValidVolumeID, Snapshot: ValidSnapshotID, Group: ValidGroupID})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			undone := false
			c := creation[VolumeRecord]{table: st.Volumes, kind: "volume", undo: func(VolumeRecord) error { undone = true; return tc.undoErr }}
			rec := VolumeRecord{ID: NewID(VolumeIDPrefix, "ab12"), Name: "pvc", Phase: PhaseCreating}
			if tc.make == nil {
				rec.Phase = PhaseReady
			}
			got, err := c.create(rec, nil, tc.make)
			if (err != nil) != errors.Is(err, boom) || (tc.phase == PhaseReady) != (err == nil) {
				t.Fatalf("create: %v", err)
			}
			if err == nil && got.Phase != PhaseReady {
				t.Fatalf("created %+v", got)
			}
			v, ok := st.Volumes.Get(rec.ID)
			if tc.phase == "" && ok || tc.phase != "" && (!ok || v.Phase != tc.phase) {
				t.Fatalf("record after: %+v %v, want phase %q", v, ok, tc.phase)
			}
			if undone != tc.undone {
				t.Fatalf("undo ran: %v", undone)
			}
			klog.Flush()
			if tc.wantLogs != "" && !strings.Contains(logs.String(), tc.wantLogs) {
				t.Fatalf("log %q, want %q", logs.String(), tc.wantLogs)
			}
		})
	}
}
