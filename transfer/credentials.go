package transfer

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"
)

// An Authority is where a node's credentials come from: the authorities
// its peers' certificates must chain to, and a certificate for its own
// key. A StoreAuthority holds the signing key itself; one reached through
// an API (a signer elsewhere, which checks who asks) keeps it from the
// nodes.
type Authority interface {
	// Trust returns the authorities whose certificates are trusted now,
	// newest first.
	Trust(ctx context.Context) ([]*x509.Certificate, error)
	// Issue returns a certificate (DER) for a certificate request (DER,
	// see NewRequest) of node, valid for about life: the authority may
	// make it shorter.
	Issue(ctx context.Context, node string, csr []byte, life time.Duration) ([]byte, error)
}

// Default lifetimes: the authority's, and a node certificate's (renewed at
// half of it, so a stolen one is useless within a day).
const (
	DefaultAuthorityLifetime = 365 * 24 * time.Hour
	DefaultLeafLifetime      = 24 * time.Hour
	// DefaultSignedLifetime is what a node asks a signer for: hours, so
	// a certificate taken from a node is soon useless.
	DefaultSignedLifetime = 6 * time.Hour
)

// Credentials are one node's: the certificates it trusts and its own.
// Refresh (or Run) keeps them current; the zero lifetimes mean the
// defaults.
type Credentials struct {
	// Authority issues this node's certificates and says whom to trust.
	// When it is nil, a StoreAuthority on Store is used (with
	// AuthorityLifetime and Now).
	Authority Authority
	Store     Store
	Driver    string // the driver name every certificate of the deployment names
	Node      string // this node's name, in its certificate

	AuthorityLifetime, LeafLifetime time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	auth  Authority // Authority, or the StoreAuthority made for Store
	roots *x509.CertPool
	cas   []*x509.Certificate
	leaf  *tls.Certificate
}

func (c *Credentials) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Credentials) leafLifetime() time.Duration {
	if c.LeafLifetime == 0 {
		return DefaultLeafLifetime
	}
	return c.LeafLifetime
}

// maxPeerLifetime is the longest a peer's certificate may be valid for:
// what this node's own are made for (every node of a deployment asks for
// the same), backdated, with room for a clock a little off. A certificate
// made for longer (by someone holding the authority's key) is refused
// however it chains, by servers and clients alike.
func (c *Credentials) maxPeerLifetime() time.Duration {
	return c.leafLifetime() + Backdate + 5*time.Minute
}

func (c *Credentials) authority() Authority {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.auth == nil {
		c.auth = c.Authority
		if c.auth == nil {
			c.auth = &StoreAuthority{Store: c.Store, Driver: c.Driver, Lifetime: c.AuthorityLifetime, Now: c.now}
		}
	}
	return c.auth
}

// Identity is the URI a certificate of driver's node carries, and what a
// server checks the driver name against; the controller's
// (ControllerPeer) is the driver's /controller.
func Identity(driver, node string) *url.URL {
	if node == ControllerPeer {
		return &url.URL{Scheme: "csi-transfer", Host: driver, Path: "/controller"}
	}
	return &url.URL{Scheme: "csi-transfer", Host: driver, Path: "/node/" + node}
}

// ControllerPeer is the name in the certificate of the deployment's
// controller (--mode=controller), which asks nodes for snapshots and
// expansions of the volumes they hold and is served nothing else: no
// Kubernetes node can have it ('@' is not allowed in a node name), so a
// node's certificate is never the controller's, nor the controller's a
// node's.
const ControllerPeer = "@controller"

// Refresh asks the authority whom to trust and gets this node a new
// certificate when it has none, when half of its life is gone, or when
// its issuer is no longer the newest authority. The key of a new one is
// made here and never leaves this process.
func (c *Credentials) Refresh(ctx context.Context) error {
	auth := c.authority()
	cas, err := auth.Trust(ctx)
	if err != nil {
		return err
	}
	if len(cas) == 0 {
		return errors.New("the transfer authority trusts no certificate")
	}
	roots := x509.NewCertPool()
	for _, ca := range cas {
		roots.AddCert(ca)
	}
	life := c.leafLifetime()
	c.mu.Lock()
	c.roots, c.cas = roots, cas
	now := c.now()
	l := c.leaf
	keep := l != nil && l.Leaf.NotAfter.Sub(now) > life/2 && c.keepIssuer(l.Leaf, cas, now)
	c.mu.Unlock()
	if keep {
		return nil
	}
	// Issuing may take a while (a signer elsewhere): no lock is held,
	// and the certificate held meanwhile stays in use.
	key, csr, err := NewRequest(c.Driver, c.Node)
	if err != nil {
		return err
	}
	der, err := auth.Issue(ctx, c.Node, csr, life)
	if err != nil {
		return fmt.Errorf("getting this node's transfer certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("the transfer authority issued a damaged certificate: %w", err)
	}
	if err := c.checkIssued(leaf, key.Public(), cas); err != nil {
		return err
	}
	c.mu.Lock()
	c.leaf = &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	c.mu.Unlock()
	return nil
}

// checkIssued refuses a certificate this node could not use: not for its
// key, not naming it, or not from an authority its peers trust.
func (c *Credentials) checkIssued(leaf *x509.Certificate, pub crypto.PublicKey, cas []*x509.Certificate) error {
	if k, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(pub) {
		return errors.New("the transfer authority issued a certificate for another key")
	}
	if peerNode(leaf, c.Driver) != c.Node {
		return fmt.Errorf("the transfer authority issued a certificate that does not name node %s of driver %s", c.Node, c.Driver)
	}
	for _, ca := range cas {
		if leaf.CheckSignatureFrom(ca) == nil {
			return nil
		}
	}
	return errors.New("the transfer authority issued a certificate that chains to none of the authorities it trusts")
}

// Backdate is how far before its making a certificate is valid from, so
// clocks a little behind still accept it.
const Backdate = 5 * time.Minute

// Propagation is how long a new authority is given to reach every node
// (each re-reads the authorities every minute) before certificates it
// signed are presented: until then a node keeps its certificate from the
// authority before, which every node trusts.
const Propagation = 10 * time.Minute

// keepIssuer reports whether a certificate's issuer may stay: it is the
// newest authority, or one still trusted while the newest is younger than
// Propagation.
func (c *Credentials) keepIssuer(leaf *x509.Certificate, cas []*x509.Certificate, now time.Time) bool {
	if leaf.CheckSignatureFrom(cas[0]) == nil {
		return true
	}
	if now.Sub(cas[0].NotBefore) > Propagation+Backdate {
		return false
	}
	for _, ca := range cas[1:] {
		if leaf.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}

// Run refreshes every interval until ctx ends, telling onErr of failures
// (the credentials held stay in use meanwhile).
func (c *Credentials) Run(ctx context.Context, every time.Duration, onErr func(error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.Refresh(ctx); err != nil && onErr != nil {
				onErr(err)
			}
		}
	}
}

// current returns the trusted roots and this node's certificate.
func (c *Credentials) current() (*x509.CertPool, *tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaf == nil {
		return nil, nil, errors.New("transfer credentials not loaded yet")
	}
	return c.roots, c.leaf, nil
}

// Expiry is when this node's certificate ends (zero before the first
// Refresh).
func (c *Credentials) Expiry() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leaf == nil {
		return time.Time{}
	}
	return c.leaf.Leaf.NotAfter
}
