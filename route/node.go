package route

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/transfer"
)

// Target is what a node's control endpoint serves: its driver's
// controller and group controller services.
type Target interface {
	csi.ControllerServer
	csi.GroupControllerServer
}

// Routed are the calls a node takes from the controller; every other
// method of the services (CreateVolume, ControllerPublishVolume, ...) is
// refused.
var Routed = map[string]bool{
	csi.Controller_CreateSnapshot_FullMethodName:                      true,
	csi.Controller_DeleteSnapshot_FullMethodName:                      true,
	csi.Controller_ListSnapshots_FullMethodName:                       true,
	csi.Controller_GetSnapshot_FullMethodName:                         true,
	csi.Controller_ControllerExpandVolume_FullMethodName:              true,
	csi.Controller_ControllerModifyVolume_FullMethodName:              true,
	csi.Controller_ControllerGetCapabilities_FullMethodName:           true,
	csi.GroupController_CreateVolumeGroupSnapshot_FullMethodName:      true,
	csi.GroupController_DeleteVolumeGroupSnapshot_FullMethodName:      true,
	csi.GroupController_GetVolumeGroupSnapshot_FullMethodName:         true,
	csi.GroupController_GroupControllerGetCapabilities_FullMethodName: true,
}

// MaxControlConns bounds the authenticated connections a node's control
// endpoint holds (those in their handshake are the gate's: see
// ServeNode): only the controller (two replicas, one leader each for the
// snapshotter and resizer) completes one.
const MaxControlConns = 32

// ServeNode serves t's routed calls on ln until ctx ends, over creds'
// control TLS (transfer.Credentials.ControlServerConfig: only the
// controller's certificate), each call through inner (the driver's own
// logging and metrics) after the method and the peer are checked.
func ServeNode(ctx context.Context, ln net.Listener, creds *transfer.Credentials, t Target, inner grpc.UnaryServerInterceptor) error {
	cfg := creds.ControlServerConfig()
	srv := grpc.NewServer(
		grpc.Creds(handshaken{credentials.NewTLS(cfg)}),
		grpc.ChainUnaryInterceptor(admit(creds.Driver), inner),
		grpc.MaxConcurrentStreams(16),
		grpc.MaxRecvMsgSize(1<<20),
		grpc.ConnectionTimeout(10e9),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10e9, PermitWithoutStream: true}),
	)
	csi.RegisterControllerServer(srv, t)
	csi.RegisterGroupControllerServer(srv, t)
	go func() {
		<-ctx.Done()
		srv.GracefulStop()
	}()
	// The transfer's gate does the TLS handshakes before gRPC sees a
	// connection: at most 8 in their handshake from one address (an
	// address at its cap makes room by closing its own oldest idle one),
	// 64 in all, 3 s each, and MaxControlConns authenticated. Before, any
	// pod could hold the 32 slots with idle connections, 10 s each, and
	// keep the controller out of the node.
	return srv.Serve(transfer.Gate(ln, cfg, transfer.GateOptions{
		Handshake: 3 * time.Second, PerPeer: 8, Pending: 64,
		Conns: MaxControlConns, PerName: MaxControlConns,
		NameOf: func(*tls.Conn) string { return transfer.ControllerPeer }, // the handshake admits no one else
		Creds:  creds,                                                     // the controller knocks: out of reach of a flood
	}))
}

// handshaken are the server credentials of connections the gate hands
// over with their TLS handshake done: gRPC's TLS credentials would start
// a second one on them. What they tell gRPC of the peer is what its own
// would (the TLS state), so admit reads the certificate as before; the
// embedded credentials answer the rest.
type handshaken struct {
	credentials.TransportCredentials
}

// ServerHandshake takes the gate's finished handshake.
func (handshaken) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := c.(*transfer.GatedConn)
	if !ok {
		return nil, nil, errors.New("a connection that did not come through the gate")
	}
	st := tc.ConnectionState()
	if st.NegotiatedProtocol != "h2" {
		return nil, nil, fmt.Errorf("the client did not negotiate h2 (ALPN %q)", st.NegotiatedProtocol)
	}
	return c, credentials.TLSInfo{State: st, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

// admit lets through only the routed calls, and only from the controller
// (which the TLS handshake already required; checked again here, where a
// change to the TLS set-up would otherwise pass unnoticed).
func admit(driver string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, ok := peer.FromContext(ctx)
		tlsInfo, isTLS := credentials.TLSInfo{}, false
		if ok {
			tlsInfo, isTLS = p.AuthInfo.(credentials.TLSInfo)
		}
		if !isTLS || len(tlsInfo.State.PeerCertificates) == 0 || transfer.PeerName(tlsInfo.State.PeerCertificates[0], driver) != transfer.ControllerPeer {
			return nil, status.Error(codes.PermissionDenied, "only the controller of this driver may call a node's control endpoint")
		}
		if !Routed[info.FullMethod] {
			return nil, status.Errorf(codes.PermissionDenied, "%s is not taken on a node's control endpoint", info.FullMethod)
		}
		return handler(ctx, req)
	}
}
