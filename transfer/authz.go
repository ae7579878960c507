package transfer

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"
)

// An Authorizer decides whether an authenticated peer may have a source.
// The server asks it after the peer's certificate and the request's form
// are checked and before the source is opened or a stream slot is taken.
// An error that wraps ErrRefused reaches the peer as a refusal (403); any
// other as a failure it may retry.
//
// Authentication says which node asks; only the authorizer knows whether
// that node has any business with the source (for the CSI driver: a
// restore or clone of it pending on that node), so a node that is taken
// reads what is being restored onto it, not every node's data.
type Authorizer interface {
	Authorize(ctx context.Context, peer, kind, id string) error
}

// AuthorizerFunc is an Authorizer made of a function.
type AuthorizerFunc func(ctx context.Context, peer, kind, id string) error

// Authorize implements Authorizer.
func (f AuthorizerFunc) Authorize(ctx context.Context, peer, kind, id string) error {
	return f(ctx, peer, kind, id)
}

// AllowAll authorizes every authenticated peer for every source: for
// tests and for drivers in one process, never for a cluster.
var AllowAll Authorizer = AuthorizerFunc(func(context.Context, string, string, string) error { return nil })

// checkLifetime refuses a peer certificate valid for longer than max.
func checkLifetime(cert *x509.Certificate, max time.Duration) error {
	if life := cert.NotAfter.Sub(cert.NotBefore); life > max {
		return fmt.Errorf("%w: the certificate of %s is valid for %s, longer than the %s this node accepts", ErrRefused, cert.Subject.CommonName, life.Round(time.Minute), max)
	}
	return nil
}
