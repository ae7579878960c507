package transfer

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
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

// A Store keeps an authority's certificates and key. Save with version ""
// creates; otherwise it replaces the data only if it is still at that
// version, so two holders never roll the authority over twice or make two
// of them.
type Store interface {
	Load(ctx context.Context) (data map[string][]byte, version string, err error)
	Save(ctx context.Context, data map[string][]byte, version string) error
}

// StoreAuthority is an Authority whose certificates and key are in a
// Store: it makes the authority when there is none, rolls it over when a
// third of its life is left, and signs with the newest key. Whoever holds
// one holds the key.
type StoreAuthority struct {
	Store  Store
	Driver string
	// Lifetime is the authority's; zero means DefaultAuthorityLifetime.
	Lifetime time.Duration
	// RetireAfter is how long an authority stays trusted once its
	// successor is made: long enough for every node to move to the
	// successor and for the longest certificate it signed to end. Zero
	// keeps it trusted until it ends itself (months): a rollover asked
	// because its key was seen would then protect nothing for that long.
	RetireAfter time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu  sync.Mutex
	cas []*x509.Certificate
	key crypto.Signer
}

func (a *StoreAuthority) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Trust implements Authority: the authorities in the Store that have not
// ended, newest first, made or rolled over first when needed.
func (a *StoreAuthority) Trust(ctx context.Context) ([]*x509.Certificate, error) {
	return a.trust(ctx, nil)
}

// RollOver is Trust, with the newest authority replaced also when due
// says so of it (its key was seen where it should not have been, say);
// the one replaced stays trusted, as in a rollover that came due. due is
// asked again of what another holder may have saved meanwhile, so two
// holders do not roll over twice.
func (a *StoreAuthority) RollOver(ctx context.Context, due func(newest *x509.Certificate) bool) ([]*x509.Certificate, error) {
	return a.trust(ctx, due)
}

func (a *StoreAuthority) trust(ctx context.Context, due func(*x509.Certificate) bool) ([]*x509.Certificate, error) {
	life := a.Lifetime
	if life == 0 {
		life = DefaultAuthorityLifetime
	}
	var cas []*x509.Certificate
	var key crypto.Signer
	for try := 0; ; try++ {
		if try == 5 {
			return nil, fmt.Errorf("saving the transfer authority: %w (5 tries)", ErrConflict)
		}
		data, version, err := a.Store.Load(ctx)
		if errors.Is(err, ErrNoAuthority) {
			data, version = nil, ""
		} else if err != nil {
			return nil, fmt.Errorf("loading the transfer authority: %w", err)
		}
		now := a.now()
		if data != nil {
			if cas, key, err = ParseAuthority(data, now); err != nil {
				return nil, err
			}
		} else {
			cas, key = nil, nil
		}
		if key != nil && cas[0].NotAfter.Sub(now) > life/3 && (due == nil || !due(cas[0])) {
			break
		}
		ca, caKey, err := newAuthority(a.Driver, now, life)
		if err != nil {
			return nil, err
		}
		cas, key = append([]*x509.Certificate{ca}, cas...), caKey
		out, err := encodeAuthority(cas, key)
		if err != nil {
			return nil, err
		}
		for k, v := range data { // what else the holder keeps there
			if k != CertsKey && k != KeyKey {
				out[k] = v
			}
		}
		if err := a.Store.Save(ctx, out, version); errors.Is(err, ErrConflict) {
			continue // another holder saved first: use what it saved
		} else if err != nil {
			return nil, fmt.Errorf("saving the transfer authority: %w", err)
		}
		break
	}
	cas = a.retire(cas, a.now())
	a.mu.Lock()
	a.cas, a.key = cas, key
	a.mu.Unlock()
	return cas, nil
}

// retire leaves out of cas (newest first) every authority whose successor
// was made more than RetireAfter ago.
func (a *StoreAuthority) retire(cas []*x509.Certificate, now time.Time) []*x509.Certificate {
	if a.RetireAfter <= 0 {
		return cas
	}
	for i := 1; i < len(cas); i++ {
		// A successor is backdated: it was made Backdate after its
		// NotBefore.
		if now.After(cas[i-1].NotBefore.Add(Backdate + a.RetireAfter)) {
			return cas[:i]
		}
	}
	return cas
}

// Issue implements Authority: it checks the request names node and signs
// it with the newest authority, backdated a little.
func (a *StoreAuthority) Issue(ctx context.Context, node string, csr []byte, life time.Duration) ([]byte, error) {
	req, err := CheckRequest(csr, a.Driver, node)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	cas, key := a.cas, a.key
	a.mu.Unlock()
	if key == nil {
		if cas, err = a.Trust(ctx); err != nil {
			return nil, err
		}
		a.mu.Lock()
		key = a.key
		a.mu.Unlock()
	}
	now := a.now()
	return SignRequest(cas[0], key, req.PublicKey, a.Driver, node, now.Add(-Backdate), now.Add(life))
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
		NotBefore:             now.Add(-Backdate),
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

// ParseCertificates reads PEM certificates of authorities: those still
// valid at now, in their order (newest first, as authorities are kept).
func ParseCertificates(certs []byte, now time.Time) ([]*x509.Certificate, error) {
	var cas []*x509.Certificate
	rest := certs
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return cas, nil
		}
		ca, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the transfer authority's certificates are damaged: %w", err)
		}
		if ca.IsCA && now.Before(ca.NotAfter) {
			cas = append(cas, ca)
		}
	}
}

// ParseAuthority reads a Store's data: the certificates still valid at
// now, newest first, and the newest one's key (nil when that certificate
// has expired, and the authority must be rolled over).
func ParseAuthority(data map[string][]byte, now time.Time) ([]*x509.Certificate, crypto.Signer, error) {
	cas, err := ParseCertificates(data[CertsKey], now)
	if err != nil {
		return nil, nil, err
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
