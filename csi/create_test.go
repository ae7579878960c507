package csi

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
		make     func(volumeRecord) (volumeRecord, error)
		undoErr  error
		phase    string // the record's phase after; "" for no record
		undone   bool
		wantLogs string
	}{
		{"made", func(v volumeRecord) (volumeRecord, error) { v.Phase = phaseReady; return v, nil }, nil, phaseReady, false, ""},
		{"make fails", func(volumeRecord) (volumeRecord, error) { return volumeRecord{}, boom }, nil, "", true, ""},
		{"make and undo fail", func(volumeRecord) (volumeRecord, error) { return volumeRecord{}, boom }, errors.New("undo failed"), phaseCreating, true, "cleaning up after a failed create"},
		{"nothing to make", nil, nil, phaseReady, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			st, err := store.Open(t.TempDir(), store.IDRules{Volume: validVolumeID, Snapshot: validSnapshotID, Group: validGroupID})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			undone := false
			c := creation[volumeRecord]{table: st.Volumes, kind: "volume", undo: func(volumeRecord) error { undone = true; return tc.undoErr }}
			rec := volumeRecord{ID: newID(volumeIDPrefix, "ab12"), Name: "pvc", Phase: phaseCreating}
			if tc.make == nil {
				rec.Phase = phaseReady
			}
			got, err := c.create(rec, nil, tc.make)
			if (err != nil) != errors.Is(err, boom) || (tc.phase == phaseReady) != (err == nil) {
				t.Fatalf("create: %v", err)
			}
			if err == nil && got.Phase != phaseReady {
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
