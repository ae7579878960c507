package main

import (
	"os"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(o options) bool
	}{
		{name: "defaults", args: []string{"--nodeid=n1"}, check: func(o options) bool {
			c := o.cfg
			return c.DriverName == "hostpath.csi.k8s.io" && c.StateDir == "/csi-data-dir" && c.Endpoint == "unix:///tmp/csi.sock" &&
				c.MaxVolumeSize == 1<<40 && c.EnableTopology && c.EnableVolumeExpansion && !c.EnableAttach && c.Version != ""
		}},
		{name: "reference manifest args", args: []string{"--drivername=hostpath.csi.k8s.io", "--v=5", "--endpoint=unix:///csi/csi.sock", "--nodeid=node1"}, check: func(o options) bool { return o.cfg.Endpoint == "unix:///csi/csi.sock" && o.cfg.NodeID == "node1" }},
		{name: "single dash like the reference", args: []string{"-nodeid", "n", "-endpoint", "/run/csi/csi.sock", "-v", "5"}, check: func(o options) bool { return o.cfg.Endpoint == "/run/csi/csi.sock" }},
		{name: "capacity kinds", args: []string{"--nodeid=n", "--capacity=fast=1Gi", "--capacity", "slow=1.5T"}, check: func(o options) bool {
			return o.cfg.Capacity["fast"] == 1<<30 && o.cfg.Capacity["slow"] == 1_500_000_000_000
		}},
		{name: "max volume size", args: []string{"--nodeid=n", "--max-volume-size=10Gi"}, check: func(o options) bool { return o.cfg.MaxVolumeSize == 10<<30 }},
		{name: "missing node id", args: nil, wantErr: "--nodeid is required"},
		{name: "unknown flag", args: []string{"--nodeid=n", "--ephemeral-everything"}, wantErr: "not defined"},
		{name: "bad capacity", args: []string{"--nodeid=n", "--capacity=fast"}, wantErr: "kind=quantity"},
		{name: "duplicate capacity kind", args: []string{"--nodeid=n", "--capacity=a=1", "--capacity=a=2"}, wantErr: "given twice"},
		{name: "bad size", args: []string{"--nodeid=n", "--max-volume-size=lots"}, wantErr: "not a size"},
		{name: "zero max size", args: []string{"--nodeid=n", "--max-volume-size=0"}, wantErr: "must be positive"},
		{name: "negative max volumes", args: []string{"--nodeid=n", "--maxvolumespernode=-1"}, wantErr: "0 (no limit) or more"},
		{name: "stray argument", args: []string{"--nodeid=n", "extra"}, wantErr: "unexpected argument"},
		{name: "tcp endpoint", args: []string{"--nodeid=n", "--endpoint=tcp://0.0.0.0:10000"}, wantErr: "only unix sockets"},
		// Argument lists of the reference driver's own deploy manifests and
		// their test variants: each starts, and each flag means what it
		// means there (or is accepted with a warning where it means nothing
		// here).
		{name: "reference plugin manifest", args: []string{"--drivername=hostpath.csi.k8s.io", "--v=5", "--endpoint=unix:///csi/csi.sock", "--nodeid=node1"}, check: func(o options) bool { return len(o.warnings) == 0 }},
		{name: "reference lifecycle checks and attach limit", args: []string{"--drivername=hostpath.csi.k8s.io", "--v=5", "--endpoint=unix:///csi/csi.sock", "--nodeid=node1", "--check-volume-lifecycle=true", "--attach-limit=16"}, check: func(o options) bool {
			return o.cfg.MaxVolumesPerNode == 16 && len(o.warnings) == 1 && strings.Contains(o.warnings[0], "check-volume-lifecycle")
		}},
		{name: "reference ephemeral mode", args: []string{"--drivername=hostpath.csi.k8s.io", "--nodeid=node1", "--ephemeral"}, check: func(o options) bool {
			return len(o.warnings) == 1 && strings.Contains(o.warnings[0], "--ephemeral")
		}},
		{name: "reference expansion switches", args: []string{"--nodeid=node1", "--disable-controller-expansion", "--max-volume-size-node=2147483648"}, check: func(o options) bool {
			return o.cfg.DisableControllerExpansion && !o.cfg.DisableNodeExpansion && o.cfg.MaxVolumeSizeNode == 2<<30
		}},
		{name: "reference node expansion off", args: []string{"--nodeid=node1", "--disable-node-expansion=true"}, check: func(o options) bool { return o.cfg.DisableNodeExpansion }},
		{name: "reference modify volume", args: []string{"--nodeid=node1", "--enable-controller-modify-volume=true", "--accepted-mutable-parameter-names=snapshotFormat, kind"}, check: func(o options) bool {
			return o.cfg.EnableModifyVolume && strings.Join(o.cfg.AcceptedMutableParameters, "|") == "snapshotFormat|kind"
		}},
		{name: "reference snapshot metadata", args: []string{"--nodeid=node1", "--enable-snapshot-metadata", "--snapshot-metadata-block-type=FIXED_LENGTH"}, check: func(o options) bool {
			return o.cfg.EnableSnapshotMetadata && o.cfg.SnapshotMetadataFixedLength
		}},
		{name: "reference list snapshots off", args: []string{"--nodeid=node1", "--enable-list-snapshots=false"}, check: func(o options) bool { return o.cfg.DisableListSnapshots }},
		{name: "list snapshots on by default", args: []string{"--nodeid=node1", "--enable-list-snapshots"}, check: func(o options) bool { return !o.cfg.DisableListSnapshots }},
		{name: "bad block type", args: []string{"--nodeid=n", "--snapshot-metadata-block-type=RANDOM"}, wantErr: "FIXED_LENGTH or VARIABLE_LENGTH"},
		{name: "disagreeing limits", args: []string{"--nodeid=n", "--attach-limit=3", "--maxvolumespernode=4"}, wantErr: "disagree"},
		{name: "version needs no node id", args: []string{"--version"}, check: func(o options) bool { return o.showVersion }},
		{name: "mark-pool needs no node id", args: []string{"--mark-pool=hdd", "--pool=hdd=/pools/hdd", "--statedir=/s"}, check: func(o options) bool {
			return o.markPool == "hdd" && o.cfg.Pools["hdd"] == "/pools/hdd"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Fatalf("error is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Fatalf("unexpected options %+v", o.cfg)
			}
		})
	}
}

// TestVersionFile: the VERSION file and the version the binary reports
// name the same release.
func TestVersionFile(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != baseVersion {
		t.Fatalf("VERSION says %s, the code %s", got, baseVersion)
	}
}
