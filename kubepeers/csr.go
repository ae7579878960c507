package kubepeers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hostpath-csi/hostpath/kube"
	"github.com/hostpath-csi/hostpath/transfer"
)

// CSRAuthority is a node's transfer.Authority when a Signer holds the key:
// the node asks for its certificate with a Kubernetes certificate signing
// request (its key never leaves it; the API server records who asked, with
// the node its token is bound to), and trusts the authorities the Signer
// publishes in its ConfigMap, which nodes may read and not write.
type CSRAuthority struct {
	Client kube.Interface
	// Signer is the signer name the requests ask for.
	Signer string
	// Namespace and Bundle name the Signer's ConfigMap.
	Namespace, Bundle string
	// Poll is how often a request is looked at until it is decided; zero
	// means half a second. Timeout bounds the wait; zero means two
	// minutes.
	Poll, Timeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Owner, when set, owns the requests made (the CSIDriver object, which
	// is cluster-scoped as requests are): uninstalling the driver deletes
	// what the signer has not swept yet, and nodes need no delete.
	Owner *metav1.OwnerReference
}

// ErrDenied is what Issue returns when the signer refused the request.
var ErrDenied = errors.New("the transfer's signer refused this node's certificate request")

// Trust implements transfer.Authority: the certificates the Signer
// publishes, those still valid, newest first.
func (a *CSRAuthority) Trust(ctx context.Context) ([]*x509.Certificate, error) {
	cm, err := a.Client.ConfigMaps(a.Namespace).Get(ctx, a.Bundle, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the transfer's trusted authorities (ConfigMap %s/%s, written by its signer): %w", a.Namespace, a.Bundle, err)
	}
	now := time.Now()
	if a.Now != nil {
		now = a.Now()
	}
	cas, err := transfer.ParseCertificates([]byte(cm.Data[transfer.CertsKey]), now)
	if err != nil {
		return nil, err
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("the transfer's signer publishes no current authority in ConfigMap %s/%s", a.Namespace, a.Bundle)
	}
	return cas, nil
}

// Issue implements transfer.Authority: it makes a certificate signing
// request for csr and waits until the signer decides it.
func (a *CSRAuthority) Issue(ctx context.Context, node string, csr []byte, life time.Duration) ([]byte, error) {
	poll, timeout := a.Poll, a.Timeout
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	secs := int32(max(life, 10*time.Minute) / time.Second) // the API's floor
	csrs := a.Client.CertificateSigningRequests()
	who := node
	if node == transfer.ControllerPeer {
		who = "controller" // an object's name takes no '@'
	}
	meta := metav1.ObjectMeta{GenerateName: "hostpath-transfer-" + who + "-",
		Labels: maps.Clone(requestLabels)}
	if a.Owner != nil {
		meta.OwnerReferences = []metav1.OwnerReference{*a.Owner}
	}
	made, err := csrs.Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: meta,
		Spec: certv1.CertificateSigningRequestSpec{
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}),
			SignerName:        a.Signer,
			ExpirationSeconds: &secs,
			Usages:            allowedUsages,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("asking for a certificate (signer %s): %w", a.Signer, err)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	var lastErr error
	for {
		got, err := csrs.Get(ctx, made.Name, metav1.GetOptions{})
		lastErr = err
		if err == nil {
			if condition(got, certv1.CertificateDenied) || condition(got, certv1.CertificateFailed) {
				return nil, fmt.Errorf("%w: %s: %s", ErrDenied, made.Name, conditionMessage(got))
			}
			if b, _ := pem.Decode(got.Status.Certificate); b != nil && b.Type == "CERTIFICATE" {
				return b.Bytes, nil
			}
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return nil, fmt.Errorf("certificate request %s: %w (the last read of it: %v)", made.Name, ctx.Err(), lastErr)
			}
			return nil, fmt.Errorf("certificate request %s not signed in %s (is the signer %s running?): %w", made.Name, timeout, a.Signer, ctx.Err())
		case <-t.C:
		}
	}
}

func conditionMessage(csr *certv1.CertificateSigningRequest) string {
	for _, c := range csr.Status.Conditions {
		if c.Type == certv1.CertificateDenied || c.Type == certv1.CertificateFailed {
			return c.Message
		}
	}
	return ""
}
