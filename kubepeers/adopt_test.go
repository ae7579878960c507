package kubepeers

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hostpath-csi/hostpath/transfer"
)

// oneBlob serves one source, "blob/x".
type oneBlob struct{}

func (oneBlob) Open(_ context.Context, _, kind, id string, statOnly bool) (transfer.Meta, io.ReadCloser, error) {
	if kind != "blob" || id != "x" {
		return transfer.Meta{}, nil, transfer.ErrNotFound
	}
	if statOnly {
		return transfer.Meta{Format: "raw", Size: 4}, nil, nil
	}
	return transfer.Meta{Format: "raw", Size: 4}, io.NopCloser(bytes.NewReader([]byte("data"))), nil
}

// serve runs a transfer server of creds until the test ends.
func serve(t *testing.T, creds *transfer.Credentials) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = (&transfer.Server{Creds: creds, Source: oneBlob{}, Authorizer: transfer.AllowAll}).Serve(ctx, ln)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

func fetchFrom(client *transfer.Credentials, addr, node string) error {
	_, rc, err := (&transfer.Client{Creds: client, Timeout: 5 * time.Second}).Open(context.Background(), addr, node, "blob", "x", false)
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = io.ReadAll(rc)
	return err
}

// TestSignerAdoptsTheAuthorityBefore: upgrading from the release whose
// nodes shared the authority's key in a Secret, nodes of both releases
// trust each other through the adoption; the key leaves the Secret; an
// authority written there later is never trusted; the adopted one signs
// until the adoption ends, and is no longer trusted once what it signed
// has ended.
func TestSignerAdoptsTheAuthorityBefore(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	advance := func(d time.Duration) { clock.Add(int64(d)) }

	client := fake.NewClientset()
	who := &requesters{}
	client.PrependReactor("create", "certificatesigningrequests", who.react)
	legacy := &SecretStore{Client: client, Namespace: "csi", Name: "legacy"}
	old := &transfer.Credentials{Store: legacy, Driver: "d", Node: "old", Now: now}
	if err := old.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	before, _, _ := legacy.Load(context.Background())
	// (The signer's own record is in memory: the fake API keeps no
	// resource versions, by which a Secret's update is a conflict or not.)
	own := &transfer.MemoryStore{}
	pod(t, client, "driver-new", "new", "node-sa", "DaemonSet")
	s := &Signer{Client: client, Name: signerName, Driver: "d", Namespace: "csi", ServiceAccount: "node-sa",
		Authority: &transfer.StoreAuthority{Store: own, Driver: "d", Now: now},
		Bundle:    "trust", MaxLifetime: 6 * time.Hour, Legacy: legacy, AdoptFor: 2 * time.Hour, Now: now}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(err error) { t.Log(err) }, nil) }()
	t.Cleanup(func() { cancel(); <-done })

	nu := &transfer.Credentials{Driver: "d", Node: "new", Now: now, LeafLifetime: 6 * time.Hour,
		Authority: &CSRAuthority{Client: client, Signer: signerName, Namespace: "csi", Bundle: "trust", Poll: 20 * time.Millisecond, Timeout: 10 * time.Second, Now: now}}
	refresh := func(c *transfer.Credentials) {
		t.Helper()
		who.as(driverSA, "new")
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := c.Refresh(context.Background())
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // the bundle is not up yet
		}
	}
	refresh(nu)
	oldAddr, newAddr := serve(t, old), serve(t, nu)

	data, _, err := legacy.Load(ctx)
	if err != nil || len(data[transfer.KeyKey]) != 0 || !bytes.Equal(data[transfer.CertsKey], before[transfer.CertsKey]) {
		t.Fatalf("after adoption the old Secret holds a key %v, the same certificates %v (%v)", len(data[transfer.KeyKey]) != 0, bytes.Equal(data[transfer.CertsKey], before[transfer.CertsKey]), err)
	}
	both := func(what string) {
		t.Helper()
		if err := fetchFrom(old, newAddr, "new"); err != nil {
			t.Fatalf("%s: the old node restoring from the new one: %v", what, err)
		}
		if err := fetchFrom(nu, oldAddr, "old"); err != nil {
			t.Fatalf("%s: the new node restoring from the old one: %v", what, err)
		}
	}
	both("adopted")

	// An authority written into the old Secret by hand after the adoption.
	planted, err := (&transfer.StoreAuthority{Store: &transfer.MemoryStore{}, Driver: "d", Now: now}).Trust(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sec, _ := client.CoreV1().Secrets("csi").Get(ctx, "legacy", metav1.GetOptions{})
	sec.Data[transfer.CertsKey] = append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: planted[0].Raw}), sec.Data[transfer.CertsKey]...)
	if _, err := client.CoreV1().Secrets("csi").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	bundle := func() []string {
		t.Helper()
		var names []string
		for _, c := range publish(t, s, now()) {
			if c.Equal(planted[0]) {
				t.Fatal("the authority planted in the old Secret is trusted")
			}
			names = append(names, c.Subject.CommonName)
		}
		return names
	}
	if b := bundle(); len(b) != 1 {
		t.Fatalf("during the adoption the bundle is %v", b)
	}

	// The adoption ends: a new authority, the adopted one still trusted;
	// until the new one has reached every node, nodes keep their
	// certificates from the adopted one (an old node, were one left,
	// would still be reached both ways); then they move to the new one.
	advance(2*time.Hour + time.Minute)
	if b := bundle(); len(b) != 2 {
		t.Fatalf("after the adoption the bundle is %v", b)
	}
	expiry := nu.Expiry()
	refresh(nu)
	both("right after the adoption ended")
	advance(transfer.Propagation + 6*time.Minute)
	refresh(nu)
	if !nu.Expiry().After(expiry) {
		t.Fatal("the new node did not move to the signer's own authority")
	}

	// Past what the adopted authority signed: no longer trusted, and the
	// old Secret is gone.
	advance(6*time.Hour + 15*time.Minute)
	if b := bundle(); len(b) != 1 {
		t.Fatalf("after the adopted authority's certificates ended the bundle is %v", b)
	}
	refresh(nu)
	if _, err := client.CoreV1().Secrets("csi").Get(ctx, "legacy", metav1.GetOptions{}); err == nil {
		t.Fatal("the old Secret is still there")
	}
	// Neither the old node's certificate, nor one minted with the key the
	// old Secret held (which every old node could read), is accepted now.
	if err := fetchFrom(old, newAddr, "new"); err == nil {
		t.Fatal("an old node's certificate from the adopted authority is still accepted")
	}
	cas, key, err := transfer.ParseAuthority(before, now())
	if err != nil || key == nil {
		t.Fatal(err)
	}
	forged, err := transfer.IssueLeaf(cas[0], key, "d", "old", now().Add(-time.Minute), now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// Sent whatever authorities the server asks for.
	send := func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return forged, nil }
	tr := &http.Transport{TLSClientConfig: &tls.Config{GetClientCertificate: send, InsecureSkipVerify: true, Time: now}}
	defer tr.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + newAddr + "/v1/d/blob/x"); err == nil {
		resp.Body.Close()
		t.Fatalf("a certificate minted with the old Secret's key was answered: %s", resp.Status)
	} else if !strings.Contains(err.Error(), "unknown certificate authority") {
		t.Fatalf("a certificate minted with the old Secret's key: %v, want an unknown authority", err)
	}
}
