package transfer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// The control channel: the deployment's controller (ControllerPeer) asks
// the node that holds a volume to snapshot or expand it, over the same
// authority's mutual TLS as the transfer, with HTTP/2 (gRPC) on a port of
// its own. A node serves it only to the controller's certificate, and the
// controller talks only to a server whose certificate names the node it
// dialled: a node cannot pass for another, nor anyone but the controller
// ask a node for anything on it.

// ControlServerConfig is the TLS configuration of a node's control
// endpoint: this node's current certificate, and only a client whose
// certificate chains to an authority trusted now, names the controller of
// this driver and is made for no longer than a node's own (see
// serverConfig).
func (c *Credentials) ControlServerConfig() *tls.Config {
	return c.serverConfig("h2", func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 || peerNode(cs.PeerCertificates[0], c.Driver) != ControllerPeer {
			return fmt.Errorf("%w: the client is not the controller of driver %s", ErrRefused, c.Driver)
		}
		return checkLifetime(cs.PeerCertificates[0], c.maxPeerLifetime())
	})
}

// ControlClientConfig is the controller's TLS configuration for dialling
// node's control endpoint: its current certificate, and a server whose
// certificate chains to an authority trusted now and names that node of
// this driver. The chain is checked here rather than by crypto/tls
// because the authorities roll over while a connection pool lives.
func (c *Credentials) ControlClientConfig(node string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		ServerName: node,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			_, leaf, err := c.current()
			return leaf, err
		},
		// Verified below, against the authorities trusted at the time.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			roots, _, err := c.current()
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the node presented no certificate")
			}
			cert := cs.PeerCertificates[0]
			opts := x509.VerifyOptions{Roots: roots, CurrentTime: c.now(), DNSName: node, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			if _, err := cert.Verify(opts); err != nil {
				return fmt.Errorf("%w: the certificate of %s: %v", ErrRefused, node, err)
			}
			if peerNode(cert, c.Driver) != node {
				return fmt.Errorf("%w: the server does not present node %s of driver %s", ErrRefused, node, c.Driver)
			}
			return checkLifetime(cert, c.maxPeerLifetime())
		},
	}
}

// PeerName is the peer a verified certificate names for driver: a node's
// name, ControllerPeer, or "" for none.
func PeerName(cert *x509.Certificate, driver string) string { return peerNode(cert, driver) }
