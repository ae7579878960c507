package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	hcsi "github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/kube"
	"github.com/hostpath-csi/hostpath/kubepeers"
	"github.com/hostpath-csi/hostpath/kubestandby"
	"github.com/hostpath-csi/hostpath/route"
	"github.com/hostpath-csi/hostpath/transfer"
)

// serveControl takes the controller's calls about this node's volumes at
// endpoint, with the node's transfer credentials, until ctx ends.
func serveControl(ctx context.Context, d *hcsi.Driver, creds *transfer.Credentials, endpoint string) {
	ln, err := net.Listen("tcp", endpoint)
	if err != nil {
		klog.ErrorS(err, "no control endpoint: the controller cannot snapshot or expand this node's volumes", "endpoint", endpoint)
		return
	}
	klog.InfoS("taking the controller's calls about this node's volumes", "endpoint", endpoint)
	if err := route.ServeNode(ctx, ln, creds, d, d.UnaryInterceptor()); err != nil {
		klog.ErrorS(err, "control endpoint stopped", "endpoint", endpoint)
	}
}

// controllerCaps are the controller capabilities that route to the nodes,
// as the flags set them for the nodes' drivers too.
func controllerCaps(cfg engine.Config) []csi.ControllerServiceCapability_RPC_Type {
	caps := []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	}
	if !cfg.DisableListSnapshots {
		caps = append(caps, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS)
	}
	if cfg.EnableVolumeExpansion && !cfg.DisableControllerExpansion {
		caps = append(caps, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME)
	}
	if cfg.EnableModifyVolume {
		caps = append(caps, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME)
	}
	return caps
}

// groupSnapshotAPIReady answers whether the API server serves the group
// snapshot API now, or says it has none (404). The csi-snapshotter
// (v8.7.0) asks for it once, right after the driver's Probe first says
// ready, and on any error (an i/o timeout while a rescheduled pod's
// network is not yet routed, seen in make e2e NODES=3 after a node
// loss) disables group snapshots for the rest of its run: the
// VolumeGroupSnapshots then never become ready or go away. Probe says
// ready only once this answers, so that question comes when the API
// server just did.
func groupSnapshotAPIReady(client kube.Interface) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := client.Served(ctx, "/apis/groupsnapshot.storage.k8s.io/v1")
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
}

// runController serves the controller side of CSI (package route) on the
// CSI socket, for the csi-snapshotter and csi-resizer beside it, until
// SIGTERM (exit 0) or a failure (exit 1). It runs in a cluster only: its
// certificate comes from the transfer signer, and the nodes from the
// CSINodes.
func runController(o options) int {
	_, client, ok := inClusterClient("the controller runs only in a cluster")
	if !ok {
		fmt.Fprintln(os.Stderr, "hostpathplugin: --mode=controller runs only in a cluster (no in-cluster service account here)")
		return 1
	}
	_, portStr, err := net.SplitHostPort(o.controlEndpoint)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil {
		fmt.Fprintf(os.Stderr, "hostpathplugin: --control-endpoint=%q: want host:port, whose port each node's control endpoint listens on\n", o.controlEndpoint)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	creds := signedCredentials(ctx, client, o, transfer.ControllerPeer)
	go func() {
		if obtain(ctx, creds, "the controller's certificate") {
			keepFresh(ctx, creds, "the controller's certificate")
		}
	}()

	c := &route.Controller{Name: o.cfg.DriverName, Version: o.cfg.Version, Creds: creds, KeyOf: engine.KeyOf,
		Resolver: &kubepeers.Resolver{Client: client, Driver: o.cfg.DriverName, Port: port, KeyOf: engine.NodeTag},
		Caps:     controllerCaps(o.cfg), Ready: groupSnapshotAPIReady(client),
		// A volume with a standby copy moves with its id.
		Holders: kubestandby.Holders(client, o.cfg.DriverName)}
	defer c.Close()
	ln, path, err := hcsi.ListenSocket(o.cfg.Endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hostpathplugin: %v\n", err)
		return 1
	}
	defer os.Remove(path)
	srv := grpc.NewServer(grpc.UnaryInterceptor(hcsi.LogInterceptor))
	csi.RegisterIdentityServer(srv, c)
	csi.RegisterControllerServer(srv, c)
	csi.RegisterGroupControllerServer(srv, c)
	defer serveReady(o.httpEndpoint, func() error {
		if creds.Expiry().IsZero() {
			return errors.New("no certificate from the transfer signer yet")
		}
		return nil
	})()
	go hcsi.StopWhenDone(ctx, srv, o.cfg.ShutdownGrace)
	klog.InfoS("controller serving CSI: each call goes to the node that holds its volume", "endpoint", path, "driver", o.cfg.DriverName, "controlPort", port)
	if err := srv.Serve(ln); err != nil {
		klog.ErrorS(err, "serving CSI")
		return 1
	}
	klog.InfoS("stopped")
	klog.Flush()
	return 0
}
