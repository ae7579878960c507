package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

const (
	driverName      = "hostpath.csi.k8s.io"
	transferSecret  = "hostpath-csi-transfer-authority"
	transferPort    = "9470"
	transferURIPath = "/node/"
)

// authority is the transfer authority as the Secret holds it, which any
// driver pod may read today (issue 28 takes the key away from the nodes).
type authority struct {
	roots *x509.CertPool
	ca    *x509.Certificate
	key   any
}

func readAuthority(t *testing.T, k *kube) authority {
	t.Helper()
	field := func(name string) []byte {
		b64 := k.jsonpath(driverNS, "secret/"+transferSecret, "{.data."+strings.ReplaceAll(name, ".", `\.`)+"}")
		b, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatalf("the Secret's %s: %v", name, err)
		}
		return b
	}
	var a authority
	a.roots = x509.NewCertPool()
	rest := field("ca.crt")
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if a.ca == nil {
			a.ca = c // newest first
		}
		a.roots.AddCert(c)
	}
	b, _ := pem.Decode(field("ca.key"))
	if a.ca == nil || b == nil {
		t.Fatal("the transfer authority's Secret has no certificate or no key")
	}
	key, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	a.key = key
	return a
}

// mint makes a certificate naming node, as a node makes its own, valid
// for life.
func (a authority) mint(t *testing.T, node string, life time.Duration) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sn, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: node},
		URIs:         []*url.URL{{Scheme: "csi-transfer", Host: driverName, Path: transferURIPath + node}},
		DNSNames:     []string{node},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(life),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.ca, key.Public(), a.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// askPeer asks node's transfer port for a source with cert and returns
// the answer's status and body.
func askPeer(t *testing.T, k *kube, a authority, node string, cert tls.Certificate, kind, id string) (int, string) {
	t.Helper()
	ip := k.jsonpath("", "node/"+node, `{.status.addresses[?(@.type=="InternalIP")].address}`)
	tr := &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: a.roots, ServerName: node, Certificates: []tls.Certificate{cert}}}
	defer tr.CloseIdleConnections()
	u := "https://" + net.JoinHostPort(ip, transferPort) + "/v1/" + driverName + "/" + kind + "/" + id
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Head(u)
	if err != nil {
		t.Fatalf("asking %s for %s %s: %v", node, kind, id, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return resp.StatusCode, strings.TrimSpace(string(body)) + " " + resp.Header.Get("X-Transfer-Meta")
}

// peerAttempts plays a node that holds the transfer authority's key (a
// taken node, today): with a certificate it minted for itself it asks
// node for a snapshot and a live volume that no claim on it is being
// filled from, and is refused; with one made to last a year it is refused
// whatever it asks. A real restore of the same sources follows (the
// caller's), and works.
func peerAttempts(t *testing.T, k *kube, node, snapshot, volume string) {
	var as string
	for _, n := range strings.Fields(k.must("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")) {
		if n != node {
			as = n
			break
		}
	}
	step(t, "a node with a valid certificate but no pending restore is refused "+node+"'s snapshot and live volume", func() {
		a := readAuthority(t, k)
		cert := a.mint(t, as, time.Hour)
		for _, src := range []struct{ kind, id string }{{"snapshot", snapshot}, {"volume", volume}} {
			code, body := askPeer(t, k, a, node, cert, src.kind, src.id)
			if code != http.StatusForbidden {
				t.Fatalf("%s (as %s, nothing pending) asked %s for %s %s: HTTP %d %s, want 403", as, as, node, src.kind, src.id, code, body)
			}
		}
		year := a.mint(t, as, 365*24*time.Hour)
		if code, body := askPeer(t, k, a, node, year, "snapshot", snapshot); code != http.StatusForbidden {
			t.Fatalf("a certificate valid for a year: HTTP %d %s, want 403", code, body)
		}
		fmt.Printf("e2e      %s refused its snapshot %s and volume %s to %s (nothing pending there), and a year-long certificate\n", node, snapshot, volume, as)
	})
}
