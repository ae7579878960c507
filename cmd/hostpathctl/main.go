// Command hostpathctl is a small CSI client for a running hostpathplugin:
// it lists volumes and snapshots and runs a demo that shows the driver at
// work, step by step with timings.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func usage() {
	fmt.Fprintf(os.Stderr, `usage: hostpathctl [--endpoint unix:///path/csi.sock] COMMAND
commands:
  info    driver name, version, node, capabilities
  list    volumes and snapshots
  demo    create, publish, write, snapshot, restore and clone a volume, printing each step and its time (--dir for mount points)
`)
	os.Exit(2)
}

func main() {
	endpoint := flag.String("endpoint", "unix://"+defaultSocket(), "CSI endpoint of the driver")
	dir := flag.String("dir", os.TempDir(), "demo: directory for staging and target paths")
	flag.Usage = usage
	flag.Parse()
	if flag.NArg() != 1 {
		usage()
	}
	conn, err := grpc.NewClient(*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	c := client{
		id:   csi.NewIdentityClient(conn),
		ctrl: csi.NewControllerClient(conn),
		node: csi.NewNodeClient(conn),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	switch flag.Arg(0) {
	case "info":
		err = c.info(ctx)
	case "list":
		err = c.list(ctx)
	case "demo":
		err = c.demo(ctx, *dir)
	default:
		usage()
	}
	if err != nil {
		fail(err)
	}
}

func defaultSocket() string {
	if wd, err := os.Getwd(); err == nil {
		return wd + "/run/csi.sock"
	}
	return "/tmp/csi.sock"
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "hostpathctl: %v\n", err)
	os.Exit(1)
}

type client struct {
	id   csi.IdentityClient
	ctrl csi.ControllerClient
	node csi.NodeClient
}

func (c client) info(ctx context.Context) error {
	pi, err := c.id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return err
	}
	ni, err := c.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return err
	}
	cc, err := c.ctrl.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		return err
	}
	fmt.Printf("driver   %s %s\nnode     %s (max volumes %d)\ncontroller:", pi.GetName(), pi.GetVendorVersion(), ni.GetNodeId(), ni.GetMaxVolumesPerNode())
	for _, cp := range cc.GetCapabilities() {
		fmt.Printf(" %s", cp.GetRpc().GetType())
	}
	fmt.Println()
	return nil
}

func (c client) list(ctx context.Context) error {
	token := ""
	for {
		lv, err := c.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 100, StartingToken: token})
		if err != nil {
			return err
		}
		for _, e := range lv.GetEntries() {
			fmt.Printf("volume   %s  %d bytes  nodes %v\n", e.GetVolume().GetVolumeId(), e.GetVolume().GetCapacityBytes(), e.GetStatus().GetPublishedNodeIds())
		}
		if token = lv.GetNextToken(); token == "" {
			break
		}
	}
	ls, err := c.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil {
		return err
	}
	for _, e := range ls.GetEntries() {
		s := e.GetSnapshot()
		fmt.Printf("snapshot %s  of %s  %d bytes  ready=%v\n", s.GetSnapshotId(), s.GetSourceVolumeId(), s.GetSizeBytes(), s.GetReadyToUse())
	}
	return nil
}
