package route

import (
	"context"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/hostpath-csi/hostpath/transfer"
)

// knocking are the controller's credentials for a node's control
// endpoint: each connection knocks (transfer's knock.go) before its TLS
// handshake, so a flood from the controller's own address cannot keep it
// out. A node that does not take the knock (the previous release, whose
// TLS reads it as a broken handshake) is asked without one for a while:
// gRPC dials again after a failed handshake.
type knocking struct {
	credentials.TransportCredentials
	creds *transfer.Credentials
	node  string

	mu      sync.Mutex
	refused time.Time // when a knocked handshake last failed
}

// noKnockFor is how long a node whose knocked handshake failed is asked
// without a knock.
const noKnockFor = 10 * time.Minute

// ClientHandshake knocks, then hands over to TLS.
func (k *knocking) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	k.mu.Lock()
	knock := time.Since(k.refused) > noKnockFor
	k.mu.Unlock()
	if knock {
		if err := k.creds.KnockOn(raw, k.node); err != nil {
			return nil, nil, err
		}
	}
	conn, info, err := k.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil && knock && ctx.Err() == nil {
		k.mu.Lock()
		k.refused = time.Now()
		k.mu.Unlock()
	}
	return conn, info, err
}

// Clone keeps the knock.
func (k *knocking) Clone() credentials.TransportCredentials {
	return &knocking{TransportCredentials: k.TransportCredentials.Clone(), creds: k.creds, node: k.node}
}
