package localcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificate authority and the files made from it.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// newPKI makes a CA, the API server's serving certificate, client
// certificates for every component and the service-account key pair.
func newPKI(dir string, hostIP net.IP, nodeName string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hostpath-csi-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caCert: ca, caKey: key}
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := p.writeKey("ca.key", key); err != nil {
		return nil, err
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), hostIP, net.ParseIP(serviceIP)}
	names := []string{"localhost", nodeName, "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	if err := p.issue("apiserver", "kube-apiserver", nil, ips, names, true); err != nil {
		return nil, err
	}
	if err := p.issue("kubelet", nodeName, nil, ips, names, true); err != nil {
		return nil, err
	}
	// One client identity per component. The admin, the controller
	// manager, the scheduler and kube-proxy use their built-in RBAC users;
	// kubelet is a node (Node authorizer).
	clients := map[string][2]string{
		"admin":                   {"admin", "system:masters"},
		"kube-controller-manager": {"system:kube-controller-manager", ""},
		"kube-scheduler":          {"system:kube-scheduler", ""},
		"kube-proxy":              {"system:kube-proxy", "system:node-proxier"},
		"kubelet-client":          {"system:node:" + nodeName, "system:nodes"},
		"apiserver-kubelet":       {"kube-apiserver-kubelet-client", "system:masters"},
	}
	for file, id := range clients {
		var orgs []string
		if id[1] != "" {
			orgs = []string{id[1]}
		}
		if err := p.issue(file, id[0], orgs, nil, nil, false); err != nil {
			return nil, err
		}
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	return p, writePEM(p.path("sa.pub"), "PUBLIC KEY", pub)
}

var serial = big.NewInt(1)

// issue writes name.crt and name.key, signed by the CA.
func (p *pki) issue(name, cn string, orgs []string, ips []net.IP, dns []string, server bool) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial = new(big.Int).Add(serial, big.NewInt(1))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses: ips, DNSNames: dns,
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	if err := writePEM(p.path(name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return p.writeKey(name+".key", key)
}

func (p *pki) writeKey(name string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(p.path(name), "EC PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// kubeconfig writes a kubeconfig for a client certificate made by issue.
func (p *pki) kubeconfig(path, server, client string) error {
	read := func(n string) (string, error) {
		b, err := os.ReadFile(p.path(n))
		return base64.StdEncoding.EncodeToString(b), err
	}
	ca, err := read("ca.crt")
	if err != nil {
		return err
	}
	crt, err := read(client + ".crt")
	if err != nil {
		return err
	}
	key, err := read(client + ".key")
	if err != nil {
		return err
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: local
  context: {cluster: local, user: %s}
current-context: local
`, server, ca, client, crt, key, client)
	return os.WriteFile(path, []byte(cfg), 0o600)
}

// issueNode gives a node of a multi-node cluster its own kubelet serving
// certificate (its name and address) and client identity
// (system:node:NAME), with the kubeconfig, in the node's pki directory.
func (p *pki) issueNode(n *node, server string) error {
	np := &pki{dir: filepath.Join(n.Dir, "pki"), caCert: p.caCert, caKey: p.caKey}
	if err := os.MkdirAll(np.dir, 0o700); err != nil {
		return err
	}
	if err := writePEM(np.path("ca.crt"), "CERTIFICATE", p.caCert.Raw); err != nil {
		return err
	}
	if err := np.issue("kubelet", n.Name, nil, []net.IP{net.ParseIP(n.IP)}, []string{n.Name}, true); err != nil {
		return err
	}
	if err := np.issue("kubelet-client", "system:node:"+n.Name, []string{"system:nodes"}, nil, nil, false); err != nil {
		return err
	}
	return np.kubeconfig(np.path("kubelet-client.kubeconfig"), server, "kubelet-client")
}
