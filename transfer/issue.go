package transfer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// A node's certificate is made from its request, but its content is the
// signer's: the node's name as the subject, the driver's identity URI, the
// node's DNS name or IP address, both TLS usages, and nothing the request
// asked for beyond its key. So a request can only be refused or granted
// as this node; it cannot carry a name of its own choosing into a
// certificate.

// NewRequest makes a node's key (which never leaves the node) and a
// certificate request for it, DER, naming node of driver.
func NewRequest(driver, node string) (crypto.Signer, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: node}, URIs: []*url.URL{Identity(driver, node)}}
	tmpl.DNSNames, tmpl.IPAddresses = serverNames(node)
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	return key, der, err
}

// MaxRequestBytes bounds a certificate request: a node's (P-256, one
// name, one URI) is about 400 bytes as DER, 600 as PEM.
const MaxRequestBytes = 4 << 10

// sanOID is the subject alternative name extension, the one extension a
// node's request carries.
var sanOID = asn1.ObjectIdentifier{2, 5, 29, 17}

// ErrBadRequest is what CheckRequest's refusals wrap.
var ErrBadRequest = errors.New("the certificate request is not a node's of this driver")

// CheckRequest parses a certificate request (DER, or PEM of type
// "CERTIFICATE REQUEST") and checks that it is signed by its key, that
// the key is ECDSA P-256, and that it asks for exactly what NewRequest
// asks for node of driver: nothing else.
func CheckRequest(der []byte, driver, node string) (*x509.CertificateRequest, error) {
	if len(der) > MaxRequestBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than the %d a node's request may have", ErrBadRequest, len(der), MaxRequestBytes)
	}
	if b, _ := pem.Decode(der); b != nil {
		if b.Type != "CERTIFICATE REQUEST" {
			return nil, fmt.Errorf("%w: a PEM block of type %q", ErrBadRequest, b.Type)
		}
		der = b.Bytes
	}
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if k, ok := req.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: the key is not ECDSA P-256", ErrBadRequest)
	}
	want := Identity(driver, node).String()
	dns, ips := serverNames(node)
	switch {
	case node == "" || req.Subject.CommonName != node:
		return nil, fmt.Errorf("%w: it names %q, not node %q", ErrBadRequest, req.Subject.CommonName, node)
	case len(req.URIs) != 1 || req.URIs[0].String() != want:
		return nil, fmt.Errorf("%w: its URIs are %v, not [%s]", ErrBadRequest, req.URIs, want)
	case len(req.EmailAddresses) > 0 || len(req.DNSNames) != len(dns) || len(req.IPAddresses) != len(ips):
		return nil, fmt.Errorf("%w: it asks for names beyond the node's (%v %v %v)", ErrBadRequest, req.DNSNames, req.IPAddresses, req.EmailAddresses)
	case len(dns) == 1 && req.DNSNames[0] != dns[0],
		len(ips) == 1 && !req.IPAddresses[0].Equal(ips[0]):
		return nil, fmt.Errorf("%w: its name is not the node's", ErrBadRequest)
	case len(req.Subject.Organization)+len(req.Subject.OrganizationalUnit) > 0:
		return nil, fmt.Errorf("%w: it asks for more than a node's name", ErrBadRequest)
	}
	// Parsing fills Extensions (ExtraExtensions is only for making one):
	// a node asks for its names and nothing more.
	for _, e := range req.Extensions {
		if !e.Id.Equal(sanOID) {
			return nil, fmt.Errorf("%w: it asks for extension %v beyond a node's names", ErrBadRequest, e.Id)
		}
	}
	return req, nil
}

// SignRequest makes node's certificate for pub, signed by ca, valid from
// notBefore to notAfter (clipped to the authority's end): DER.
func SignRequest(ca *x509.Certificate, caKey crypto.Signer, pub crypto.PublicKey, driver, node string, notBefore, notAfter time.Time) ([]byte, error) {
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
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
	tmpl.DNSNames, tmpl.IPAddresses = serverNames(node)
	if node == ControllerPeer {
		// The controller only asks: it is never a server.
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
}

// serverNames are the names a node's certificate carries, which a client
// checks as it dials the node: its name, as an IP address where the node
// is named by one (some clusters name their Nodes so). The controller,
// never dialled, has none.
func serverNames(node string) ([]string, []net.IP) {
	switch ip := net.ParseIP(node); {
	case node == ControllerPeer:
		return nil, nil
	case ip != nil:
		return nil, []net.IP{ip}
	default:
		return []string{node}, nil
	}
}

// IssueLeaf makes a key and a certificate for node of driver, signed by
// ca, valid from notBefore to notAfter (clipped to the authority's end).
// It is exported for tests that play a peer with an unusual certificate.
func IssueLeaf(ca *x509.Certificate, caKey crypto.Signer, driver, node string, notBefore, notAfter time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := SignRequest(ca, caKey, key.Public(), driver, node, notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}
