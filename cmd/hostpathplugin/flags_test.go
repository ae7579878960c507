package main

import (
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
		{name: "version needs no node id", args: []string{"--version"}, check: func(o options) bool { return o.showVersion }},
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
