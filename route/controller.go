package route

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hostpath-csi/hostpath/transfer"
)

// Resolver finds the nodes of the deployment (kubepeers.Resolver in a
// cluster): the address of a node's control endpoint by the key its ids
// carry, and the keys of every node.
type Resolver interface {
	Resolve(ctx context.Context, key string) (addr, node string, err error)
	Keys(ctx context.Context) ([]string, error)
}

// Controller serves the controller side of CSI for the whole deployment
// by forwarding each call to the node that holds what it names.
type Controller struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedGroupControllerServer

	Name, Version string
	Creds         *transfer.Credentials
	Resolver      Resolver
	// KeyOf is the node key a volume, snapshot or group id carries, and
	// whether it is an id of this driver at all.
	KeyOf func(id string) (string, bool)
	// Caps are the controller capabilities offered (the node's driver's
	// that route here, as its flags set them).
	Caps []csi.ControllerServiceCapability_RPC_Type
	// ResolveTTL is how long a resolved address is used before it is
	// looked up again; zero means 30 s.
	ResolveTTL time.Duration
	// ReconnectMax is the longest wait before a node that could not be
	// reached is tried again; zero means 5 s.
	ReconnectMax time.Duration
	// Ready, if set, must answer nil before Probe says ready (the API
	// server reachable: cmd's check).
	Ready func(context.Context) error
	// MaxSnapshotsPerNode bounds the snapshot calls (single and group)
	// in flight to one node; zero means 4. One csi-snapshotter serves
	// every node with its few workers (10 by default): without a bound,
	// big snapshots on one node held them all, and no other node's
	// snapshot was asked for until they ended. Beyond it a call is
	// Aborted at once, and the snapshotter retries it.
	MaxSnapshotsPerNode int
	// Holders, if set, are the keys of the other nodes that may hold a
	// volume now: a volume with a standby copy keeps the id its first
	// node made when it moves to, or is promoted on, the copy's node.
	// They are asked, in turn, when the id's own node says the volume
	// lives elsewhere (ResourceExhausted) or cannot be asked
	// (Unavailable).
	Holders func(ctx context.Context, volumeID string) []string

	mu       sync.Mutex
	conns    map[string]*nodeConn // by key
	snapping map[string]int       // snapshot calls in flight, by key
}

// snapshotSlot takes one of the node's snapshot slots for the call on
// the volume id; the release is nil with an Aborted error when they are
// all taken.
func (c *Controller) snapshotSlot(id string) (func(), error) {
	key, ok := c.KeyOf(id)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "source volume %q is not a volume of this driver", id)
	}
	most := c.MaxSnapshotsPerNode
	if most <= 0 {
		most = 4
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snapping == nil {
		c.snapping = map[string]int{}
	}
	if c.snapping[key] >= most {
		return nil, status.Errorf(codes.Aborted, "the node of volume %s (node key %s) has %d snapshots being asked for already, the most this controller asks of one node at once; retried once one ends", id, key, most)
	}
	c.snapping[key]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.snapping[key]--; c.snapping[key] <= 0 {
			delete(c.snapping, key)
		}
	}, nil
}

// nodeConn is a connection to one node's control endpoint.
type nodeConn struct {
	addr, node string
	cc         *grpc.ClientConn
	resolved   time.Time
}

// errNode makes the status a caller sees for a node that cannot be
// asked: Unavailable, which the sidecars retry.
func errNode(what, key string, err error) error {
	return status.Errorf(codes.Unavailable, "the node that holds %s (node key %s) cannot be asked now: %v; the call is retried until it answers", what, key, err)
}

// conn returns a connection to the node of key.
func (c *Controller) conn(ctx context.Context, what, key string) (*grpc.ClientConn, string, error) {
	ttl := c.ResolveTTL
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	c.mu.Lock()
	nc := c.conns[key]
	c.mu.Unlock()
	if nc != nil && time.Since(nc.resolved) < ttl {
		return nc.cc, nc.node, nil
	}
	addr, node, err := c.Resolver.Resolve(ctx, key)
	if err != nil {
		return nil, node, errNode(what, key, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		c.conns = map[string]*nodeConn{}
	}
	if old := c.conns[key]; old != nil {
		if old.addr == addr && old.node == node {
			old.resolved = time.Now()
			return old.cc, node, nil
		}
		old.cc.Close()
		delete(c.conns, key)
	}
	reconnect := c.ReconnectMax
	if reconnect <= 0 {
		reconnect = 5 * time.Second
	}
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(&knocking{TransportCredentials: credentials.NewTLS(c.Creds.ControlClientConfig(node)), creds: c.Creds, node: node}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// gRPC's default reconnect backoff grows to 120 s: a node down for
		// a minute would then stay unasked for up to two more after it is
		// back, each call failing at once meanwhile, and the sidecars'
		// own backoff grows on those failures (a namespace of snapshots
		// took minutes to delete after a node restart). Retrying a node
		// every few seconds costs a TCP connect.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnect},
			MinConnectTimeout: min(5*time.Second, 4*reconnect),
		}),
	)
	if err != nil {
		return nil, node, errNode(what, key, err)
	}
	c.conns[key] = &nodeConn{addr: addr, node: node, cc: cc, resolved: time.Now()}
	return cc, node, nil
}

// Close closes the connections to the nodes.
func (c *Controller) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, nc := range c.conns {
		nc.cc.Close()
		delete(c.conns, k)
	}
}

// forwarded is a node's answer as the caller sees it: the node's own
// status, its message prefixed with the node's name.
func forwarded(node string, err error) error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return status.Errorf(codes.Unavailable, "node %s: %v", node, err)
	}
	return status.Errorf(s.Code(), "node %s: %s", node, s.Message())
}

// call forwards one call about id to its node: fn gets a connection.
func call[T any](ctx context.Context, c *Controller, what, id string, fn func(*grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	key, ok := c.KeyOf(id)
	if !ok {
		return zero, status.Errorf(codes.NotFound, "%s %q is not an id this driver makes", what, id)
	}
	resp, err := callNode(ctx, c, what, id, key, fn)
	if what != "volume" || c.Holders == nil || !elsewhere(err) {
		return resp, err
	}
	// The first node's answer stands unless another holds the volume.
	for _, other := range c.Holders(ctx, id) {
		if other == key {
			continue
		}
		if r, oerr := callNode(ctx, c, what, id, other, fn); !elsewhere(oerr) {
			return r, oerr
		}
	}
	return resp, err
}

// callNode forwards one call about id to the node of key.
func callNode[T any](ctx context.Context, c *Controller, what, id, key string, fn func(*grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	cc, node, err := c.conn(ctx, what+" "+id, key)
	if err != nil {
		return zero, err
	}
	resp, err := fn(cc)
	return resp, forwarded(node, err)
}

// elsewhere says whether a node's answer leaves the volume to be looked
// for on another node: it lives elsewhere, or the node cannot be asked.
func elsewhere(err error) bool {
	c := status.Code(err)
	return c == codes.ResourceExhausted || c == codes.Unavailable
}

// GetPluginInfo implements csi.IdentityServer.
func (c *Controller) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: c.Name, VendorVersion: c.Version}, nil
}

// GetPluginCapabilities implements csi.IdentityServer: the controller and
// group controller services, and online expansion where expansion is on.
func (c *Controller) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE}}},
	}
	if slices.Contains(c.Caps, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe implements csi.IdentityServer: ready once the controller holds
// its certificate, without which no node answers it, and Ready answers
// (the sidecars wait for ready).
func (c *Controller) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	ready := !c.Creds.Expiry().IsZero()
	if ready && c.Ready != nil {
		ready = c.Ready(ctx) == nil
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(ready)}, nil
}

// ControllerGetCapabilities implements csi.ControllerServer.
func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, t := range c.Caps {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return resp, nil
}

// CreateSnapshot implements csi.ControllerServer on the source volume's
// node.
func (c *Controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" || req.GetSourceVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "CreateSnapshot needs a name and a source volume id")
	}
	release, err := c.snapshotSlot(req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()
	return call(ctx, c, "volume", req.GetSourceVolumeId(), func(cc *grpc.ClientConn) (*csi.CreateSnapshotResponse, error) {
		return csi.NewControllerClient(cc).CreateSnapshot(ctx, req)
	})
}

// DeleteSnapshot implements csi.ControllerServer on the snapshot's node;
// an id this driver never makes is gone already.
func (c *Controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "DeleteSnapshot needs a snapshot id")
	}
	if _, ok := c.KeyOf(req.GetSnapshotId()); !ok {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	return call(ctx, c, "snapshot", req.GetSnapshotId(), func(cc *grpc.ClientConn) (*csi.DeleteSnapshotResponse, error) {
		return csi.NewControllerClient(cc).DeleteSnapshot(ctx, req)
	})
}

// GetSnapshot implements csi.ControllerServer on the snapshot's node.
func (c *Controller) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "GetSnapshot needs a snapshot id")
	}
	return call(ctx, c, "snapshot", req.GetSnapshotId(), func(cc *grpc.ClientConn) (*csi.GetSnapshotResponse, error) {
		return csi.NewControllerClient(cc).GetSnapshot(ctx, req)
	})
}

// ControllerExpandVolume implements csi.ControllerServer on the volume's
// node.
func (c *Controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "ControllerExpandVolume needs a volume id and a capacity range")
	}
	return call(ctx, c, "volume", req.GetVolumeId(), func(cc *grpc.ClientConn) (*csi.ControllerExpandVolumeResponse, error) {
		return csi.NewControllerClient(cc).ControllerExpandVolume(ctx, req)
	})
}

// ControllerModifyVolume implements csi.ControllerServer on the volume's
// node.
func (c *Controller) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "ControllerModifyVolume needs a volume id")
	}
	return call(ctx, c, "volume", req.GetVolumeId(), func(cc *grpc.ClientConn) (*csi.ControllerModifyVolumeResponse, error) {
		return csi.NewControllerClient(cc).ControllerModifyVolume(ctx, req)
	})
}

// ListSnapshots implements csi.ControllerServer: one snapshot or one
// volume's on their node; every snapshot from every node, node by node in
// the order of their keys, a page at a time. The token is the node's key
// and that node's own token.
func (c *Controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	one := func(id, what string) (*csi.ListSnapshotsResponse, error) {
		if _, ok := c.KeyOf(id); !ok {
			return &csi.ListSnapshotsResponse{}, nil
		}
		return call(ctx, c, what, id, func(cc *grpc.ClientConn) (*csi.ListSnapshotsResponse, error) {
			return csi.NewControllerClient(cc).ListSnapshots(ctx, req)
		})
	}
	switch {
	case req.GetSnapshotId() != "":
		return one(req.GetSnapshotId(), "snapshot")
	case req.GetSourceVolumeId() != "":
		return one(req.GetSourceVolumeId(), "volume")
	}
	keys, err := c.Resolver.Keys(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "listing the nodes of the driver: %v", err)
	}
	slices.Sort(keys)
	start, inner := 0, ""
	if t := req.GetStartingToken(); t != "" {
		k, rest, ok := strings.Cut(t, "/")
		i, found := slices.BinarySearch(keys, k)
		if !ok || !found {
			return nil, status.Errorf(codes.Aborted, "starting token %q names no node of the driver now: list again from the start", t)
		}
		start, inner = i, rest
	}
	limit := req.GetMaxEntries()
	resp := &csi.ListSnapshotsResponse{}
	// A node that answers a page token it gave before (or the one it was
	// asked with) would keep this loop asking it forever: refused. And
	// however the nodes page, one call asks at most maxListPages of them
	// and answers at most maxListEntries entries, then a token to go on.
	seen := map[string]bool{}
	if inner != "" {
		seen[keys[start]+"/"+inner] = true
	}
	pages := 0
	for i := start; i < len(keys); i++ {
		if pages++; pages > maxListPages || limit <= 0 && len(resp.Entries) >= maxListEntries {
			resp.NextToken = keys[i] + "/" + inner
			return resp, nil
		}
		cc, node, err := c.conn(ctx, "snapshots", keys[i])
		if err != nil {
			return nil, err
		}
		sub := &csi.ListSnapshotsRequest{StartingToken: inner, Secrets: req.GetSecrets()}
		if limit > 0 {
			sub.MaxEntries = limit - int32(len(resp.Entries))
		}
		page, err := csi.NewControllerClient(cc).ListSnapshots(ctx, sub)
		if err != nil {
			return nil, forwarded(node, err)
		}
		inner = ""
		resp.Entries = append(resp.Entries, page.GetEntries()...)
		full := limit > 0 && int32(len(resp.Entries)) >= limit
		switch {
		case page.GetNextToken() != "":
			t := keys[i] + "/" + page.GetNextToken()
			if seen[t] {
				return nil, status.Errorf(codes.Internal, "node %s answered the snapshots page token %q again: its list does not advance, so listing stops here (look at that node's driver)", node, page.GetNextToken())
			}
			seen[t] = true
			if full {
				resp.NextToken = keys[i] + "/" + page.GetNextToken()
				return resp, nil
			}
			// A node's page ended early: go on in that node.
			inner = page.GetNextToken()
			i--
		case full && i+1 < len(keys):
			resp.NextToken = keys[i+1] + "/"
			return resp, nil
		}
	}
	return resp, nil
}

// maxListPages and maxListEntries bound what one ListSnapshots call asks
// of the nodes and holds: past either, it answers what it has and a token
// to go on, as a node whose page ends early does.
const (
	maxListPages   = 256
	maxListEntries = 4096
)

// GroupControllerGetCapabilities implements csi.GroupControllerServer.
func (c *Controller) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}},
	}}}, nil
}

// ErrSeveralNodes is the refusal of a group snapshot of volumes on more
// than one node: a group is one instant because one node freezes all its
// members together.
var ErrSeveralNodes = errors.New("the volumes of a group snapshot must all be on one node")

// CreateVolumeGroupSnapshot implements csi.GroupControllerServer on the
// node of every member, or refuses members on several nodes.
func (c *Controller) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	if req.GetName() == "" || len(req.GetSourceVolumeIds()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "CreateVolumeGroupSnapshot needs a name and source volume ids")
	}
	byKey := map[string][]string{}
	for _, id := range req.GetSourceVolumeIds() {
		key, ok := c.KeyOf(id)
		if !ok {
			return nil, status.Errorf(codes.NotFound, "source volume %q is not a volume of this driver", id)
		}
		byKey[key] = append(byKey[key], id)
	}
	if len(byKey) > 1 {
		var parts []string
		for _, key := range slices.Sorted(maps.Keys(byKey)) {
			name := "node key " + key
			if _, node, err := c.Resolver.Resolve(ctx, key); err == nil {
				name = "node " + node
			}
			parts = append(parts, fmt.Sprintf("%s on %s", strings.Join(byKey[key], ", "), name))
		}
		return nil, status.Errorf(codes.InvalidArgument, "%v, and these are on %d: %s. Snapshot the claims of each node in a group of its own, or move them onto one node", ErrSeveralNodes, len(byKey), strings.Join(parts, "; "))
	}
	release, err := c.snapshotSlot(req.GetSourceVolumeIds()[0])
	if err != nil {
		return nil, err
	}
	defer release()
	return call(ctx, c, "volume", req.GetSourceVolumeIds()[0], func(cc *grpc.ClientConn) (*csi.CreateVolumeGroupSnapshotResponse, error) {
		return csi.NewGroupControllerClient(cc).CreateVolumeGroupSnapshot(ctx, req)
	})
}

// DeleteVolumeGroupSnapshot implements csi.GroupControllerServer on the
// group's node; an id this driver never makes is gone already.
func (c *Controller) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "DeleteVolumeGroupSnapshot needs a group snapshot id")
	}
	if _, ok := c.KeyOf(req.GetGroupSnapshotId()); !ok {
		return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
	}
	return call(ctx, c, "group snapshot", req.GetGroupSnapshotId(), func(cc *grpc.ClientConn) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
		return csi.NewGroupControllerClient(cc).DeleteVolumeGroupSnapshot(ctx, req)
	})
}

// GetVolumeGroupSnapshot implements csi.GroupControllerServer on the
// group's node.
func (c *Controller) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "GetVolumeGroupSnapshot needs a group snapshot id")
	}
	return call(ctx, c, "group snapshot", req.GetGroupSnapshotId(), func(cc *grpc.ClientConn) (*csi.GetVolumeGroupSnapshotResponse, error) {
		return csi.NewGroupControllerClient(cc).GetVolumeGroupSnapshot(ctx, req)
	})
}
