package csi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hostpath-csi/hostpath/engine"
)

// TestVolumesMarkerOnlyWhereEvident: the marker that lets start make a
// fresh block volume's file again is written where the volumes directory
// is evidently home (this start made it), and not into an existing empty
// directory on the state dir's file system, which may be the mount point
// of a disk that has not arrived.
func TestVolumesMarkerOnlyWhereEvident(t *testing.T) {
	for _, c := range []struct {
		name   string
		exists bool
		want   bool
	}{{"made by this start", false, true}, {"an empty directory that was there", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			if c.exists {
				if err := os.MkdirAll(filepath.Join(cfg.StateDir, "volumes"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			d := newDriver(t, cfg)
			_, err := os.Stat(filepath.Join(volumesDir(d), engine.VolumesMarker))
			if got := err == nil; got != c.want {
				t.Fatalf("marker written: %v, want %v", got, c.want)
			}
		})
	}
}

// TestStateFormat: a new state dir records the format it is written in; a
// driver refuses, with one line and without writing anything, a state dir
// of a newer format or one whose format file says none.
func TestStateFormat(t *testing.T) {
	cfg := testConfig(t)
	d := newDriver(t, cfg)
	if b, err := os.ReadFile(d.eng.Paths.FormatFile()); err != nil || string(b) != "hostpath-csi state format 2\n" {
		t.Fatalf("format recorded: %q %v", b, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ content, want string }{
		{"hostpath-csi state format 4\n", "written by a newer driver (state format 4; this one reads formats up to 3)"},
		{"something else\n", "does not say a format"},
	} {
		cfg := testConfig(t)
		meta := filepath.Join(cfg.StateDir, "meta")
		if err := os.MkdirAll(meta, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(meta, "format"), []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("start on a state dir whose format file says %q: %v", c.content, err)
		}
		entries, _ := os.ReadDir(cfg.StateDir)
		if len(entries) != 1 {
			t.Fatalf("the refused state dir was written to: %v", entries)
		}
		if b, _ := os.ReadFile(filepath.Join(meta, "format")); string(b) != c.content {
			t.Fatalf("the format file was rewritten: %q", b)
		}
	}
}
