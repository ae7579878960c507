package transfer

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"sync"
	"time"
)

// Keys of the authority's data in a Store.
const (
	// CertsKey holds the authority's certificates, PEM, newest first:
	// every one that has not expired is trusted.
	CertsKey = "ca.crt"
	// KeyKey holds the private key of the newest certificate, PEM.
	KeyKey = "ca.key"
)

// ErrNoAuthority is what a Store's Load returns when no authority was
// saved yet; ErrConflict is what its Save returns when the data changed
// since the version it was given (or, creating, when it exists already).
var (
	ErrNoAuthority = errors.New("no transfer authority stored yet")
	ErrConflict    = errors.New("the transfer authority changed meanwhile")
)

// A Store keeps the deployment's authority where every node can read it.
// Save with version "" creates; otherwise it replaces the data only if it
// is still at that version, so two nodes never roll the authority over
// twice or make two of them.
type Store interface {
	Load(ctx context.Context) (data map[string][]byte, version string, err error)
	Save(ctx context.Context, data map[string][]byte, version string) error
}

// Default lifetimes: the authority's, and a node certificate's (renewed at
// half of it, so a stolen one is useless within a day).
const (
	DefaultAuthorityLifetime = 365 * 24 * time.Hour
	DefaultLeafLifetime      = 24 * time.Hour
)

// Credentials are one node's: the certificates it trusts and its own.
// Refresh (or Run) keeps them current; the zero lifetimes mean the
// defaults.
type Credentials struct {
	Store  Store
	Driver string // the driver name every certificate of the deployment names
	Node   string // this node's name, in its certificate

	AuthorityLifetime, LeafLifetime time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
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

func (c *Credentials) lifetimes() (ca, leaf time.Duration) {
	ca, leaf = c.AuthorityLifetime, c.LeafLifetime
	if ca == 0 {
		ca = DefaultAuthorityLifetime
	}
	if leaf == 0 {
		leaf = DefaultLeafLifetime
	}
	return ca, leaf
}

// Identity is the URI a certificate of driver's node carries, and what a
// server checks the driver name against.
func Identity(driver, node string) *url.URL {
	return &url.URL{Scheme: "csi-transfer", Host: driver, Path: "/node/" + node}
}

// Refresh loads the authority (making it if there is none, rolling it over
// when a third of its life is left) and issues this node a certificate
// when it has none, when half of its life is gone, or when its issuer is
// no longer the newest authority.
func (c *Credentials) Refresh(ctx context.Context) error {
	caLife, leafLife := c.lifetimes()
	var cas []*x509.Certificate
	var key crypto.Signer
	for try := 0; ; try++ {
		if try == 5 {
			return fmt.Errorf("saving the transfer authority: %w (5 tries)", ErrConflict)
		}
		data, version, err := c.Store.Load(ctx)
		if errors.Is(err, ErrNoAuthority) {
			data, version = nil, ""
		} else if err != nil {
			return fmt.Errorf("loading the transfer authority: %w", err)
		}
		now := c.now()
		if data != nil {
			if cas, key, err = ParseAuthority(data, now); err != nil {
				return err
			}
		} else {
			cas, key = nil, nil
		}
		if key != nil && cas[0].NotAfter.Sub(now) > caLife/3 {
			break
		}
		ca, caKey, err := newAuthority(c.Driver, now, caLife)
		if err != nil {
			return err
		}
		cas, key = append([]*x509.Certificate{ca}, cas...), caKey
		out, err := encodeAuthority(cas, key)
		if err != nil {
			return err
		}
		if err := c.Store.Save(ctx, out, version); errors.Is(err, ErrConflict) {
			continue // another node saved first: use what it saved
		} else if err != nil {
			return fmt.Errorf("saving the transfer authority: %w", err)
		}
		break
	}
	roots := x509.NewCertPool()
	for _, ca := range cas {
		roots.AddCert(ca)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roots, c.cas = roots, cas
	now := c.now()
	if l := c.leaf; l != nil && l.Leaf.NotAfter.Sub(now) > leafLife/2 && c.keepIssuer(l.Leaf, cas, now) {
		return nil
	}
	leaf, err := issueLeaf(cas[0], key, c.Driver, c.Node, now, leafLife)
	if err != nil {
		return err
	}
	c.leaf = leaf
	return nil
}

// backdate is how far before its making a certificate is valid from, so
// clocks a little behind still accept it.
const backdate = 5 * time.Minute

// Propagation is how long a new authority is given to reach every node
// (each re-reads the store every minute) before certificates it signed are
// presented: until then a node keeps its certificate from the authority
// before, which every node trusts.
const Propagation = 10 * time.Minute

// keepIssuer reports whether a certificate's issuer may stay: it is the
// newest authority, or one still trusted while the newest is younger than
// Propagation.
func (c *Credentials) keepIssuer(leaf *x509.Certificate, cas []*x509.Certificate, now time.Time) bool {
	if leaf.CheckSignatureFrom(cas[0]) == nil {
		return true
	}
	if now.Sub(cas[0].NotBefore) > Propagation+backdate {
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

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func newAuthority(driver string, now time.Time, life time.Duration) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: driver + " transfer authority " + now.UTC().Format("2006-01-02T15:04:05Z")},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(life),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// IssueLeaf makes a certificate for node of driver, signed by ca, valid
// from notBefore to notAfter (clipped to the authority's end). It is
// exported for tests that play a peer with an unusual certificate.
func IssueLeaf(ca *x509.Certificate, caKey crypto.Signer, driver, node string, notBefore, notAfter time.Time) (*tls.Certificate, error) {
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: node},
		URIs:         []*url.URL{Identity(driver, node)},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	// The client checks the server's name as it dials it: a node named by
	// an IP address (some clusters name their Nodes so) needs an IP SAN.
	if ip := net.ParseIP(node); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{node}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func issueLeaf(ca *x509.Certificate, caKey crypto.Signer, driver, node string, now time.Time, life time.Duration) (*tls.Certificate, error) {
	return IssueLeaf(ca, caKey, driver, node, now.Add(-backdate), now.Add(life))
}

func encodeAuthority(cas []*x509.Certificate, key crypto.Signer) (map[string][]byte, error) {
	var certs []byte
	for _, ca := range cas {
		certs = append(certs, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})...)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{CertsKey: certs, KeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}, nil
}

// ParseAuthority reads a Store's data: the certificates still valid at
// now, newest first, and the newest one's key (nil when that certificate
// has expired, and the authority must be rolled over).
func ParseAuthority(data map[string][]byte, now time.Time) ([]*x509.Certificate, crypto.Signer, error) {
	var cas []*x509.Certificate
	rest := data[CertsKey]
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		ca, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("the stored transfer authority is damaged: %w", err)
		}
		if ca.IsCA && now.Before(ca.NotAfter) {
			cas = append(cas, ca)
		}
	}
	b, _ := pem.Decode(data[KeyKey])
	if b == nil {
		return nil, nil, errors.New("the stored transfer authority has no key")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("the stored transfer authority's key is damaged: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("the stored transfer authority's key cannot sign")
	}
	// The key belongs to the newest certificate. When that one has
	// expired the key signs nothing valid: no key is returned, and the
	// caller rolls the authority over.
	if len(cas) == 0 {
		return nil, nil, nil
	}
	if pub, ok := cas[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(key.Public()) {
		return cas, nil, nil
	}
	return cas, key, nil
}

// MemoryStore is a Store in memory, for drivers in one process (tests) or
// a driver alone.
type MemoryStore struct {
	mu      sync.Mutex
	data    map[string][]byte
	version int
}

// Load implements Store.
func (m *MemoryStore) Load(context.Context) (map[string][]byte, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.data == nil {
		return nil, "", ErrNoAuthority
	}
	return m.data, fmt.Sprint(m.version), nil
}

// Save implements Store.
func (m *MemoryStore) Save(_ context.Context, data map[string][]byte, version string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if (version == "") != (m.data == nil) || (version != "" && version != fmt.Sprint(m.version)) {
		return ErrConflict
	}
	m.data = data
	m.version++
	return nil
}
