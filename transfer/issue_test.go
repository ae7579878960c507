package transfer

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"
)

// TestCheckRequest: a certificate request passes only as NewRequest makes
// it for that node of that driver.
func TestCheckRequest(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	request := func(key crypto.Signer, edit func(*x509.CertificateRequest)) []byte {
		tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}, URIs: []*url.URL{Identity(driver, "node-a")}, DNSNames: []string{"node-a"}}
		if edit != nil {
			edit(tmpl)
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	_, own, err := NewRequest(driver, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	_, ipNode, _ := NewRequest(driver, "10.1.2.3")
	tampered := request(p256, nil)
	tampered[len(tampered)-3] ^= 0xff
	for _, c := range []struct {
		name string
		der  []byte
		node string
		ok   bool
	}{
		{"as NewRequest makes it", own, "node-a", true},
		{"as PEM", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: own}), "node-a", true},
		{"a node named by its address", ipNode, "10.1.2.3", true},
		{"for another node than the one asking", own, "node-b", false},
		{"another subject", request(p256, func(r *x509.CertificateRequest) { r.Subject.CommonName = "node-b" }), "node-a", false},
		{"another driver's identity", request(p256, func(r *x509.CertificateRequest) { r.URIs = []*url.URL{Identity("other.csi", "node-a")} }), "node-a", false},
		{"no identity", request(p256, func(r *x509.CertificateRequest) { r.URIs = nil }), "node-a", false},
		{"a second DNS name", request(p256, func(r *x509.CertificateRequest) { r.DNSNames = append(r.DNSNames, "node-b") }), "node-a", false},
		{"another DNS name", request(p256, func(r *x509.CertificateRequest) { r.DNSNames = []string{"api.example"} }), "node-a", false},
		{"an IP address too", request(p256, func(r *x509.CertificateRequest) { r.IPAddresses = []net.IP{net.ParseIP("10.0.0.1")} }), "node-a", false},
		{"an email address", request(p256, func(r *x509.CertificateRequest) { r.EmailAddresses = []string{"a@b"} }), "node-a", false},
		{"an organization (a group, to Kubernetes)", request(p256, func(r *x509.CertificateRequest) { r.Subject.Organization = []string{"system:masters"} }), "node-a", false},
		{"an RSA key", request(rsaKey, nil), "node-a", false},
		{"an extension beyond its names (basic constraints: CA)", request(p256, func(r *x509.CertificateRequest) {
			r.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: []byte{0x30, 0x03, 0x01, 0x01, 0xff}}}
		}), "node-a", false},
		{"larger than a node's request", request(p256, func(r *x509.CertificateRequest) {
			r.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 2, 3, 4}, Value: make([]byte, 900<<10)}}
		}), "node-a", false},
		{"a broken signature", tampered, "node-a", false},
		{"not a request", []byte("hello"), "node-a", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := CheckRequest(c.der, driver, c.node)
			if c.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadRequest)) {
				t.Fatalf("CheckRequest: %v, want ok %v", err, c.ok)
			}
		})
	}
}

// wrongAuthority issues what a node must not take: a certificate for
// another key, for another node, or from an authority it does not trust.
type wrongAuthority struct {
	*StoreAuthority
	how string
}

func (w wrongAuthority) Issue(ctx context.Context, node string, csr []byte, life time.Duration) ([]byte, error) {
	cas, err := w.Trust(ctx)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	key := w.key
	w.mu.Unlock()
	now := time.Now()
	switch w.how {
	case "another key":
		other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		return SignRequest(cas[0], key, other.Public(), driver, node, now, now.Add(life))
	case "another node":
		req, _ := x509.ParseCertificateRequest(csr)
		return SignRequest(cas[0], key, req.PublicKey, driver, "node-z", now, now.Add(life))
	default:
		req, _ := x509.ParseCertificateRequest(csr)
		ca, caKey, _ := newAuthority(driver, now, time.Hour)
		return SignRequest(ca, caKey, req.PublicKey, driver, node, now, now.Add(life))
	}
}

// TestCredentialsCheckWhatIsIssued: a node takes only a certificate for
// its own key, naming it, from an authority it trusts; otherwise Refresh
// fails and the certificate it holds stays.
func TestCredentialsCheckWhatIsIssued(t *testing.T) {
	store := &MemoryStore{}
	for _, how := range []string{"another key", "another node", "an untrusted authority"} {
		t.Run(how, func(t *testing.T) {
			c := &Credentials{Store: store, Driver: driver, Node: "node-a"}
			if err := c.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			held := c.Expiry()
			now := time.Now().Add(13 * time.Hour) // past half its life: Refresh renews
			c.Now = func() time.Time { return now }
			c.auth = wrongAuthority{&StoreAuthority{Store: store, Driver: driver}, how}
			if err := c.Refresh(context.Background()); err == nil {
				t.Fatal("a wrong certificate was taken")
			}
			if !c.Expiry().Equal(held) {
				t.Fatalf("the certificate held was replaced: %v, was %v", c.Expiry(), held)
			}
		})
	}
}

// TestRolloverRetiresTheOldAuthority: after a rollover the authority
// replaced is trusted for RetireAfter (every node moves and what it
// signed ends), then no longer: before, it stayed trusted for the rest of
// its year, so a rollover asked because its key was seen protected
// nothing.
func TestRolloverRetiresTheOldAuthority(t *testing.T) {
	now := time.Now()
	a := &StoreAuthority{Store: &MemoryStore{}, Driver: driver, RetireAfter: 7 * time.Hour, Now: func() time.Time { return now }}
	first, err := a.Trust(context.Background())
	if err != nil || len(first) != 1 {
		t.Fatal(len(first), err)
	}
	now = now.Add(time.Hour)
	cas, err := a.RollOver(context.Background(), func(*x509.Certificate) bool { return true })
	if err != nil || len(cas) != 2 || !cas[1].Equal(first[0]) {
		t.Fatalf("right after the rollover: %d authorities, %v", len(cas), err)
	}
	for _, c := range []struct {
		after time.Duration
		want  int
	}{{6 * time.Hour, 2}, {7*time.Hour + time.Minute, 1}, {30 * 24 * time.Hour, 1}} {
		now = now.Add(c.after - (now.Sub(cas[0].NotBefore) - Backdate))
		got, err := a.Trust(context.Background())
		if err != nil || len(got) != c.want || !got[0].Equal(cas[0]) {
			t.Fatalf("%v after the rollover: %d authorities trusted, want %d (%v)", c.after, len(got), c.want, err)
		}
	}
}
