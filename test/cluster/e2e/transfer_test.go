package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	driverName      = "hostpath.csi.k8s.io"
	transferSecret  = "hostpath-csi-transfer-authority"
	signerSecret    = "hostpath-csi-transfer-signer"
	trustConfigMap  = "hostpath-csi-transfer-trust"
	transferPort    = "9470"
	transferURIPath = "/node/"
)

// authority is a transfer authority's certificate and key: one the test
// makes (an attacker's), or the signer's own read from its Secret.
type authority struct {
	ca  *x509.Certificate
	key any
}

// newAuthority makes an authority of the test's own, as an attacker who
// can write a Secret would.
func newAuthority(t *testing.T) (authority, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "an attacker's transfer authority"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	kd, _ := x509.MarshalPKCS8PrivateKey(key)
	return authority{ca: ca, key: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})
}

// signerAuthority reads the signer's authority from its Secret (as only
// the cluster's admin, or the signer, can).
func signerAuthority(t *testing.T, k *kube) authority {
	t.Helper()
	certs := secretField(t, k, signerSecret, "ca.crt")
	b, _ := pem.Decode(certs)
	kb, _ := pem.Decode(secretField(t, k, signerSecret, "ca.key"))
	if b == nil || kb == nil {
		t.Fatal("the signer's Secret has no certificate or no key")
	}
	ca, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return authority{ca: ca, key: key}
}

func secretField(t *testing.T, k *kube, secret, name string) []byte {
	t.Helper()
	b64 := k.jsonpath(driverNS, "secret/"+secret, "{.data."+strings.ReplaceAll(name, ".", `\.`)+"}")
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("Secret %s's %s: %v", secret, name, err)
	}
	return b
}

// trusted is the pool of the authorities the signer publishes.
func trusted(t *testing.T, k *kube) (*x509.CertPool, []*x509.Certificate) {
	t.Helper()
	data := k.jsonpath(driverNS, "configmap/"+trustConfigMap, `{.data.ca\.crt}`)
	pool := x509.NewCertPool()
	var cas []*x509.Certificate
	rest := []byte(data)
	for {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		pool.AddCert(c)
		cas = append(cas, c)
	}
	if len(cas) == 0 {
		t.Fatalf("the signer publishes no authority in %s", trustConfigMap)
	}
	return pool, cas
}

// leafTemplate is a node's certificate as the driver's are.
func leafTemplate(node string, life time.Duration) *x509.Certificate {
	sn, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: node},
		URIs:         []*url.URL{{Scheme: "csi-transfer", Host: driverName, Path: transferURIPath + node}},
		DNSNames:     []string{node},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(life),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
}

// mint makes a certificate naming node, as a node's, valid for life.
func (a authority) mint(t *testing.T, node string, life time.Duration) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, leafTemplate(node, life), a.ca, key.Public(), a.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// asDriverOn is a kubeconfig that authenticates with a token of the
// drivers' service account bound to the driver pod on node: what a pod
// on that node holding such a token (the driver's own, say) can do.
func asDriverOn(t *testing.T, k *kube, node string) string {
	t.Helper()
	pod := k.must("get", "pods", "-n", driverNS, "-l", "app=hostpath-csi-node", "--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[0].metadata.name}")
	token := strings.TrimSpace(k.must("create", "token", "hostpath-csi-node", "-n", driverNS, "--bound-object-kind=Pod", "--bound-object-name="+pod, "--duration=10m"))
	server := k.must("config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	ca := k.must("config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}")
	cfg := filepath.Join(t.TempDir(), "driver-on-"+node+".kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, certificate-authority-data: %q}}]\nusers: [{name: u, user: {token: %q}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n", server, ca, token)
	if err := os.WriteFile(cfg, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// requestCertificate asks the signer, with the kubeconfig cfg, for a
// certificate naming node, as a driver does; it returns the certificate
// (nil if refused) and the decision's message.
func requestCertificate(t *testing.T, k *kube, cfg, node string) (*tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	l := leafTemplate(node, time.Hour)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: l.Subject, URIs: l.URIs, DNSNames: l.DNSNames}, key)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("e2e-transfer-%s-%d", node, time.Now().UnixNano())
	manifest := fmt.Sprintf(`apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata: {name: %s}
spec:
  signerName: %s/transfer
  expirationSeconds: 3600
  usages: [digital signature, client auth, server auth]
  request: %s
`, name, driverName, base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})))
	as := &kube{t: t, bin: k.bin, cfg: cfg}
	// Created as a driver creates its own (kubectl apply would add its
	// last-applied annotation, which the signer refuses on a request).
	if _, err := as.run(manifest, "create", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.run("", "delete", "csr", name, "--ignore-not-found") })
	var cert *tls.Certificate
	var msg string
	k.waitFor("certificate request "+name+" decided", 60*time.Second, func() (bool, string) {
		// Read with the requester's own rights (get), as a driver does.
		types := as.jsonpath("", "csr/"+name, "{.status.conditions[*].type}")
		msg = as.jsonpath("", "csr/"+name, "{.status.conditions[*].message}")
		if strings.Contains(types, "Denied") {
			return true, ""
		}
		b64 := as.jsonpath("", "csr/"+name, "{.status.certificate}")
		if b64 == "" {
			return false, types
		}
		der, err := base64.StdEncoding.DecodeString(b64)
		b, _ := pem.Decode(der)
		if err != nil || b == nil {
			t.Fatalf("the signed certificate: %v", err)
		}
		cert = &tls.Certificate{Certificate: [][]byte{b.Bytes}, PrivateKey: key}
		return true, ""
	})
	return cert, msg
}

// askPeer asks node's transfer port for a source with cert and returns
// the answer's status and body.
func askPeer(t *testing.T, k *kube, roots *x509.CertPool, node string, cert tls.Certificate, kind, id string) (int, string, error) {
	t.Helper()
	ip := k.jsonpath("", "node/"+node, `{.status.addresses[?(@.type=="InternalIP")].address}`)
	// The certificate is sent whatever authorities the server names.
	send := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	tr := &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: node, GetClientCertificate: send}}
	defer tr.CloseIdleConnections()
	u := "https://" + net.JoinHostPort(ip, transferPort) + "/v1/" + driverName + "/" + kind + "/" + id
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// peerAttempts plays an attacker on another node than node, with what a
// pod there can get: the drivers' service-account token bound to the
// driver pod on its node. It asks the signer for a certificate naming
// node (refused) and for one naming its own node (granted, as a driver's),
// then with that one asks node for a snapshot and a live volume that no
// claim on its node is being filled from (refused); an authority written
// into the old shared Secret by hand, and a certificate made to last a
// year, are refused too. Real restores and clones of the same sources
// follow (the caller's), and work.
func peerAttempts(t *testing.T, k *kube, node, snapContent, snapshot, volume string) {
	var as string
	for _, n := range strings.Fields(k.must("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")) {
		if n != node {
			as = n
			break
		}
	}
	roots, cas := trusted(t, k)
	var cert *tls.Certificate
	cfg := asDriverOn(t, k, as)
	step(t, "the transfer signer: a driver token bound to "+as+" gets a certificate for "+as+", not for "+node, func() {
		if c, msg := requestCertificate(t, k, cfg, node); c != nil || !strings.Contains(msg, "not node") {
			t.Fatalf("a token bound to %s asking for %s: certificate %v, decision %q", as, node, c != nil, msg)
		}
		var msg string
		if cert, msg = requestCertificate(t, k, cfg, as); cert == nil {
			t.Fatalf("a token bound to %s asking for its own node was refused: %q", as, msg)
		}
		leaf, _ := x509.ParseCertificate(cert.Certificate[0])
		if life := leaf.NotAfter.Sub(leaf.NotBefore); life > 6*time.Hour+10*time.Minute {
			t.Fatalf("the signer signed for %v", life)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("the signed certificate does not chain to the published authorities: %v", err)
		}
		fmt.Printf("e2e      the signer refused %s a certificate for %s and signed its own (%d authorities published)\n", as, node, len(cas))
	})
	step(t, "a node with a valid certificate but no pending restore is refused "+node+"'s snapshot and live volume (403)", func() {
		for _, src := range []struct{ kind, id string }{{"snapshot", snapshot}, {"volume", volume}} {
			code, body, err := askPeer(t, k, roots, node, *cert, src.kind, src.id)
			if err != nil || code != http.StatusForbidden {
				t.Fatalf("%s asked %s for %s %s: HTTP %d %s %v, want 403", as, node, src.kind, src.id, code, body, err)
			}
		}
	})
	step(t, "the admission policies confine "+as+"'s account to its own node; a restore it tries to redirect is not served", func() {
		taken := &kube{t: t, bin: k.bin, cfg: cfg}
		pv := k.jsonpath(ns, "pvc/pinned", "{.spec.volumeName}")
		// A restore of the snapshot waiting to be scheduled: the claim a
		// taken node would move to itself to be served the snapshot.
		k.apply(pvc("victim", "256Mi", "Filesystem", "{kind: VolumeSnapshot, name: xsnap, apiGroup: snapshot.storage.k8s.io}"))
		defer k.run("", "delete", "pvc", "victim", "-n", ns, "--ignore-not-found", "--wait=false")
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		req, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "cluster-reader"}}, key)
		if err != nil {
			t.Fatal(err)
		}
		csr := fmt.Sprintf(`apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata: {name: e2e-taken-%d}
spec:
  signerName: kubernetes.io/kube-apiserver-client
  usages: [client auth]
  request: %s
`, time.Now().UnixNano(), base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: req})))
		// A capacity object of the other node, for the taken one to zero.
		var otherCap string
		for _, c := range k.items("csistoragecapacities", "-n", driverNS) {
			top, _ := c["nodeTopology"].(map[string]any)
			labels, _ := top["matchLabels"].(map[string]any)
			if labels[topologyKey] == node {
				otherCap, _ = c["metadata"].(map[string]any)["name"].(string)
				break
			}
		}
		if otherCap == "" {
			t.Fatalf("no CSIStorageCapacity of %s", node)
		}
		hostPathPV := fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: e2e-taken-hostpath}
spec:
  capacity: {storage: 256Mi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /etc}
  claimRef: {namespace: %s, name: victim}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: %s, operator: In, values: [%s]}]
`, ns, topologyKey, as)
		for _, c := range []struct {
			what, stdin, says string
			args              []string
		}{
			{"put a dangling ownerReference on a claim (the garbage collector would delete it)", "", "ownerReferences or labels",
				[]string{"patch", "pvc", "pinned", "-n", ns, "--type=merge", "-p", `{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000001"}]}}`}},
			{"label a claim out of backups", "", "ownerReferences or labels",
				[]string{"label", "pvc", "pinned", "-n", ns, "velero.io/exclude-from-backup=true"}},
			{"annotate a claim", "", "annotations but volume.kubernetes.io/selected-node",
				[]string{"annotate", "pvc", "pinned", "-n", ns, "e2e.hostpath.csi/steer=1"}},
			{"create a hostPath PV on its own node, bound to a pending claim", hostPathPV, "only PersistentVolumes of this driver's CSI source",
				[]string{"create", "-f", "-"}},
			{"hold the controller's sidecars' leader Lease", "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: e2e-taken-leader, namespace: " + driverNS + "}\nspec: {holderIdentity: " + as + "}\n", `cannot create resource "leases"`,
				[]string{"create", "-f", "-"}},
			{"set " + node + "'s capacity to 0", "", "only the CSIStorageCapacity objects of its own node",
				[]string{"patch", "csistoragecapacity", otherCap, "-n", driverNS, "--type=merge", "-p", `{"capacity":"0"}`}},
			{"release a PV of " + node, "", "only PersistentVolumes whose node affinity is its own node",
				[]string{"patch", "pv", pv, "--type=merge", "-p", `{"spec":{"claimRef":null}}`}},
			{"delete a PV of " + node, "", "only PersistentVolumes whose node affinity is its own node",
				[]string{"delete", "pv", pv}},
			{"move a pending claim to itself", "", "only on a claim of an Immediate class",
				[]string{"annotate", "pvc", "victim", "-n", ns, "volume.kubernetes.io/selected-node=" + as}},
			{"remove the protection finalizer of a claim in use", "", "only the provisioner's cloning-protection finalizer",
				[]string{"patch", "pvc", "pinned", "-n", ns, "--type=json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`}},
			// An update of the status subresource sent as is (kubectl
			// patch would first get the subresource): dryRun=All in its
			// query. No node runs a snapshotter any more, so RBAC
			// refuses it before the admission policy would.
			{"patch the status handle of " + node + "'s snapshot content", "", `cannot update resource "volumesnapshotcontents/status"`,
				[]string{"replace", "--raw", "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/" + snapContent + "/status?dryRun=All", "-f", forgedStatus(t, k, snapContent)}},
			{"ask another signer for a certificate", csr, "only the transfer signer",
				[]string{"create", "-f", "-"}},
		} {
			// Dry runs: admission judges them as it would the real
			// request, and a policy that failed to deny destroys nothing.
			args := c.args
			if args[0] != "replace" {
				args = append(args, "--dry-run=server")
			}
			_, err := taken.run(c.stdin, args...)
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("%s's account tried to %s: %v, want a refusal saying %q", as, c.what, err, c.says)
			}
			fmt.Printf("e2e      %s's account tried to %s: refused (%s)\n", as, c.what, c.says)
		}
		if sel := k.jsonpath(ns, "pvc/victim", `{.metadata.annotations.volume\.kubernetes\.io/selected-node}`); sel != "" {
			t.Fatalf("the claim was moved to %q", sel)
		}
		code, body, err := askPeer(t, k, roots, node, *cert, "snapshot", snapshot)
		if err != nil || code != http.StatusForbidden {
			t.Fatalf("%s asked %s for the snapshot whose restore it tried to redirect: HTTP %d %s %v, want 403", as, node, code, body, err)
		}
		fmt.Printf("e2e      %s asked %s for the snapshot whose restore it tried to redirect: refused (403)\n", as, node)
	})
	step(t, "an authority written into the old Secret by hand is not trusted, nor a year-long certificate", func() {
		planted, crt, key := newAuthority(t)
		k.apply(fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata: {name: %s, namespace: %s}\ndata: {ca.crt: %s, ca.key: %s}\n",
			transferSecret, driverNS, base64.StdEncoding.EncodeToString(crt), base64.StdEncoding.EncodeToString(key)))
		defer k.run("", "delete", "secret", transferSecret, "-n", driverNS, "--ignore-not-found")
		if _, err := k.run("", "rollout", "restart", "-n", driverNS, "deployment/hostpath-csi-transfer-signer"); err != nil {
			t.Fatal(err)
		}
		k.must("rollout", "status", "-n", driverNS, "deployment/hostpath-csi-transfer-signer", "--timeout=120s")
		if _, now := trusted(t, k); len(now) != len(cas) || !now[0].Equal(cas[0]) {
			t.Fatalf("after a restart of the signer with an authority in the old Secret it publishes %d authorities", len(now))
		}
		if _, _, err := askPeer(t, k, roots, node, planted.mint(t, as, time.Hour), "snapshot", snapshot); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("a certificate of the planted authority: %v, want a TLS refusal", err)
		}
		year := signerAuthority(t, k).mint(t, as, 365*24*time.Hour)
		if code, body, err := askPeer(t, k, roots, node, year, "snapshot", snapshot); err != nil || code != http.StatusForbidden || !strings.Contains(body, "longer than") {
			t.Fatalf("a certificate valid for a year: HTTP %d %q %v, want 403 naming the cap", code, body, err)
		}
		fmt.Printf("e2e      %s refused a planted authority's certificate and a year-long one\n", node)
	})
}

// forgedStatus writes the content named with its status handle changed
// to another snapshot's, as a taken node would send it, and returns the
// file.
func forgedStatus(t *testing.T, k *kube, content string) string {
	t.Helper()
	var obj map[string]any
	if err := json.Unmarshal([]byte(k.must("get", "volumesnapshotcontent", content, "-o", "json")), &obj); err != nil {
		t.Fatal(err)
	}
	status, _ := obj["status"].(map[string]any)
	if status == nil {
		t.Fatalf("content %s has no status", content)
	}
	status["snapshotHandle"] = "snap-000000000000000000000000"
	b, _ := json.Marshal(obj)
	f := filepath.Join(t.TempDir(), "forged.json")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// rollOver asks the signer for a new authority, as an operator does, and
// waits until it publishes both: the restores and clones that follow run
// across the rollover (nodes keep their certificates of the one before
// until the new one has reached every node).
func rollOver(t *testing.T, k *kube) {
	step(t, "the signer's authority rolled over (asked for in its Secret): both published, the restores below run across it", func() {
		_, before := trusted(t, k)
		k.must("patch", "secret", signerSecret, "-n", driverNS, "-p", `{"stringData":{"rollover-requested":"`+time.Now().UTC().Format(time.RFC3339)+`"}}`)
		k.waitFor("a new authority published beside the one before", 90*time.Second, func() (bool, string) {
			_, cas := trusted(t, k)
			return len(cas) == len(before)+1 && cas[1].Equal(before[0]), fmt.Sprintf("%d authorities", len(cas))
		})
	})
}
