package csi

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// TopologyKey is the topology segment every volume of this driver carries:
// volumes live on one node.
const TopologyKey = "topology.hostpath.csi/node"

// Driver serves the CSI Identity, Controller and Node services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	csi.UnimplementedGroupControllerServer
	csi.UnimplementedSnapshotMetadataServer

	// eng is the storage side: records, pools, locks, placement,
	// reconcile and data. Each handler checks its request and makes one
	// call into it; its errors become gRPC codes at the edge.
	eng     *engine.Engine
	metrics *metrics

	mu     sync.Mutex
	socket string // the CSI socket once it listens
	ready  atomic.Bool
}

// New checks the configuration, opens the storage engine on the state dir
// (which loads and reconciles the state) and wraps it in the CSI services.
// The driver is ready when it returns.
func New(cfg engine.Config) (*Driver, error) {
	if cfg.NodeID == "" {
		return nil, fmt.Errorf("a node id is required (--nodeid)")
	}
	if cfg.DriverName == "" {
		return nil, fmt.Errorf("a driver name is required (--drivername)")
	}
	d := &Driver{}
	// The engine reports the bytes it moves; the counter is made with the
	// other metrics once the engine is open (nothing moves before).
	e, err := engine.Open(cfg, func(op string, n int64) { d.metrics.moved(op, n) })
	if err != nil {
		return nil, err
	}
	d.eng = e
	d.metrics = newMetrics(d)
	d.ready.Store(true)
	return d, nil
}

// Engine is the storage engine the driver serves: what cmd wires to the
// cluster (peers, fences, standby nodes) and runs beside the CSI services.
func (d *Driver) Engine() *engine.Engine { return d.eng }

// Close stops the engine's background work and closes its state.
func (d *Driver) Close() error { return d.eng.Close() }

// Serve listens on the endpoint (unix://path or a bare path; a stale socket
// is replaced) and serves until ctx is done, then stops gracefully.
func (d *Driver) Serve(ctx context.Context) error {
	lis, path, err := ListenSocket(d.eng.Config.Endpoint)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	d.mu.Lock()
	d.socket = path
	d.mu.Unlock()
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.interceptor), grpc.StreamInterceptor(streamInterceptor))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	csi.RegisterNodeServer(srv, d)
	csi.RegisterGroupControllerServer(srv, d)
	if d.eng.Config.EnableSnapshotMetadata {
		csi.RegisterSnapshotMetadataServer(srv, d)
	}
	klog.InfoS("serving CSI", "endpoint", path, "driver", d.eng.Config.DriverName, "version", d.eng.Config.Version, "node", d.eng.Config.NodeID, "stateDir", d.eng.Paths.Root)
	go StopWhenDone(ctx, srv, d.eng.Config.ShutdownGrace)
	return srv.Serve(lis)
}

// StopWhenDone stops srv when ctx ends: it takes no more calls and lets
// those in flight finish, but not forever (kubelet's grace period is 30 s
// by default): after grace they are stopped.
func StopWhenDone(ctx context.Context, srv *grpc.Server, grace time.Duration) {
	<-ctx.Done()
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		klog.InfoS("calls still running after the grace period; stopping them", "grace", grace)
		srv.Stop()
	}
}

// ListenSocket listens on the unix socket of endpoint (see SocketPath),
// making its directory and replacing a stale socket; the caller removes
// the socket (path) when it stops.
func ListenSocket(endpoint string) (net.Listener, string, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, "", err
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, "", fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	return lis, path, err
}

// SocketPath accepts unix:///abs, unix://abs, unix:abs or a bare path.
func SocketPath(endpoint string) (string, error) {
	p := endpoint
	switch {
	case strings.HasPrefix(p, "unix://"):
		p = strings.TrimPrefix(p, "unix://")
	case strings.HasPrefix(p, "unix:"):
		p = strings.TrimPrefix(p, "unix:")
	case strings.Contains(p, "://"):
		return "", fmt.Errorf("endpoint %q: only unix sockets are supported (unix:///path or a path)", endpoint)
	}
	if p == "" {
		return "", fmt.Errorf("endpoint %q names no socket path", endpoint)
	}
	return filepath.Abs(p)
}
