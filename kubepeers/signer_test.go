package kubepeers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hostpath-csi/hostpath/kube/kubefake"
	"github.com/hostpath-csi/hostpath/transfer"
)

const (
	signerName = "hostpath.csi.k8s.io/transfer"
	driverSA   = "system:serviceaccount:csi:node-sa"
)

// requesters plays the API server's authentication: it records, on each
// certificate request made, who asked as the API server would (the
// username and the extra of the token the request came with), which the
// requester cannot choose.
type requesters struct {
	mu    sync.Mutex
	next  []func(*certv1.CertificateSigningRequestSpec)
	names int
}

func (r *requesters) as(user string, node string) {
	extra := map[string]certv1.ExtraValue{}
	if node != "" {
		extra = map[string]certv1.ExtraValue{NodeNameExtra: {node}, PodNameExtra: {"driver-" + node}, PodUIDExtra: {"uid-driver-" + node}}
	}
	r.asWith(user, extra)
}

// asWith is as, with the token's extra as given.
func (r *requesters) asWith(user string, extra map[string]certv1.ExtraValue) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next = append(r.next, func(s *certv1.CertificateSigningRequestSpec) {
		s.Username = user
		if len(extra) > 0 {
			s.Extra = extra
		}
	})
}

// pod makes a pod in csi on node, run by account, controlled by kind
// ("" for no controller), with UID "uid-"+name.
func pod(t *testing.T, client *fake.Clientset, name, node, account, kind string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "csi", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: account}}
	if kind != "" {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "hostpath-csi-node", UID: "ds", Controller: ptr(true)}}
	}
	if _, err := client.CoreV1().Pods("csi").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (r *requesters) react(a k8stesting.Action) (bool, runtime.Object, error) {
	csr := a.(k8stesting.CreateAction).GetObject().(*certv1.CertificateSigningRequest)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.next) == 0 {
		return true, nil, errors.New("the test named no requester")
	}
	r.next[0](&csr.Spec)
	r.next = r.next[1:]
	if csr.Name == "" {
		r.names++
		csr.Name = fmt.Sprintf("%s%05d", csr.GenerateName, r.names)
	}
	return false, nil, nil
}

// publish has the signer publish and returns the authorities its bundle
// then holds that are valid at now.
func publish(t *testing.T, s *Signer, now time.Time) []*x509.Certificate {
	t.Helper()
	ctx := context.Background()
	if err := s.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	cm, err := s.Client.ConfigMaps(s.Namespace).Get(ctx, s.Bundle, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cas, err := transfer.ParseCertificates([]byte(cm.Data[transfer.CertsKey]), now)
	if err != nil {
		t.Fatal(err)
	}
	return cas
}

// TestSignerGrantsOnlyTheTokensNode: through the CSR API, a node's driver
// gets a certificate for its own node and nothing else; the node's key
// never leaves it; the lifetime is capped; what nodes trust is what the
// signer publishes from its own record.
func TestSignerGrantsOnlyTheTokensNode(t *testing.T) {
	const ctrlSA = "system:serviceaccount:csi:ctrl-sa"
	client := fake.NewClientset()
	who := &requesters{}
	client.PrependReactor("create", "certificatesigningrequests", who.react)
	pod(t, client, "driver-n1", "n1", "node-sa", "DaemonSet")
	pod(t, client, "bare", "n1", "node-sa", "")
	pod(t, client, "elsewhere", "n2", "node-sa", "DaemonSet")
	pod(t, client, "other-sa", "n1", "other", "DaemonSet")
	pod(t, client, "ctrl", "n2", "ctrl-sa", "ReplicaSet")
	pod(t, client, "ctrl-ds", "n1", "ctrl-sa", "DaemonSet")
	var decisions sync.Map
	s := &Signer{Client: kubefake.New(client, nil), Name: signerName, Driver: "d", Namespace: "csi", ServiceAccount: "node-sa", ControllerServiceAccount: "ctrl-sa",
		Authority: &transfer.StoreAuthority{Store: &SecretStore{Client: kubefake.New(client, nil), Namespace: "csi", Name: "signer-key"}, Driver: "d"},
		Bundle:    "trust", MaxLifetime: 6 * time.Hour,
		OnDecision: func(csr, node string, granted bool, reason string) { decisions.Store(csr, reason) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, func(err error) { t.Log(err) }, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	node := func(name string) *transfer.Credentials {
		return &transfer.Credentials{Driver: "d", Node: name, LeafLifetime: 24 * time.Hour,
			Authority: &CSRAuthority{Client: kubefake.New(client, nil), Signer: signerName, Namespace: "csi", Bundle: "trust", Poll: 20 * time.Millisecond, Timeout: 10 * time.Second}}
	}
	// The bundle is up before the first request is decided.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := client.CoreV1().ConfigMaps("csi").Get(ctx, "trust", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the signer published no authorities")
		}
		time.Sleep(20 * time.Millisecond)
	}

	boundTo := func(node, pod, uid string) map[string]certv1.ExtraValue {
		e := map[string]certv1.ExtraValue{NodeNameExtra: {node}}
		if pod != "" {
			e[PodNameExtra], e[PodUIDExtra] = certv1.ExtraValue{pod}, certv1.ExtraValue{uid}
		}
		return e
	}
	cases := []struct {
		name       string
		user, node string // the requester as the API server authenticated it
		extra      map[string]certv1.ExtraValue
		asks       string // the node the driver asks a certificate for
		granted    bool
		inErr      string
	}{
		{"a driver's token bound to its node, for that node", driverSA, "n1", nil, "n1", true, ""},
		{"a driver's token bound to n1, for n2", driverSA, "n1", nil, "n2", false, "not node"},
		{"a token bound to no pod", driverSA, "", nil, "n1", false, "bound to no node"},
		{"another service account on that node", "system:serviceaccount:csi:other", "n1", nil, "n1", false, "not by the drivers' service account"},
		{"a user", "admin", "", nil, "n1", false, "not by the drivers' service account"},
		{"a token bound to the Node object", driverSA, "", boundTo("n1", "", ""), "n1", false, "bound to no pod"},
		{"a token of a pod since replaced", driverSA, "", boundTo("n1", "driver-n1", "uid-old"), "n1", false, "not the pod of that name now"},
		{"a token of a pod that is gone", driverSA, "", boundTo("n1", "gone", "uid-gone"), "n1", false, "does not exist"},
		{"a token of a bare pod", driverSA, "", boundTo("n1", "bare", "uid-bare"), "n1", false, "not a driver pod"},
		{"a token whose pod runs elsewhere", driverSA, "", boundTo("n1", "elsewhere", "uid-elsewhere"), "n1", false, "runs on"},
		{"a token of a pod of another account", driverSA, "", boundTo("n1", "other-sa", "uid-other-sa"), "n1", false, "runs as"},
		{"the controller's token, for the controller", ctrlSA, "", boundTo("n2", "ctrl", "uid-ctrl"), transfer.ControllerPeer, true, ""},
		{"the controller's token, for its pod's node", ctrlSA, "", boundTo("n2", "ctrl", "uid-ctrl"), "n2", false, "asked by a controller's account"},
		{"a driver's token, for the controller", driverSA, "n1", nil, transfer.ControllerPeer, false, "not node"},
		{"the controller's account in a DaemonSet's pod", ctrlSA, "", boundTo("n1", "ctrl-ds", "uid-ctrl-ds"), transfer.ControllerPeer, false, "not a controller pod"},
		{"the controller's account, a token of another pod", ctrlSA, "n2", nil, transfer.ControllerPeer, false, "does not exist"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.extra != nil {
				who.asWith(c.user, c.extra)
			} else {
				who.as(c.user, c.node)
			}
			creds := node(c.asks)
			err := creds.Refresh(context.Background())
			if !c.granted {
				if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), c.inErr) {
					t.Fatalf("Refresh: %v, want a refusal saying %q", err, c.inErr)
				}
				if !creds.Expiry().IsZero() {
					t.Fatal("a refused node holds a certificate")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Capped to the signer's 6 hours though 24 were asked for.
			if life := time.Until(creds.Expiry()); life > 6*time.Hour || life < 5*time.Hour {
				t.Fatalf("the certificate lives %v", life)
			}
		})
	}
	// No request holds a private key: only requests left the nodes.
	list, err := client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != len(cases) {
		t.Fatalf("%d requests (%v)", len(list.Items), err)
	}
	for _, csr := range list.Items {
		if strings.Contains(string(csr.Spec.Request), "PRIVATE KEY") {
			t.Fatalf("%s carries a private key", csr.Name)
		}
		if errs := validation.IsDNS1123Subdomain(csr.Name); len(errs) > 0 {
			t.Fatalf("request name %q, which the API server refuses: %v", csr.Name, errs)
		}
	}

	t.Run("the bundle is the signer's own record", func(t *testing.T) {
		cm, err := client.CoreV1().ConfigMaps("csi").Get(ctx, "trust", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Someone plants an authority of theirs in the bundle; the
		// signer's next publication puts its own record back.
		planted := &transfer.StoreAuthority{Store: &transfer.MemoryStore{}, Driver: "d"}
		theirs, err := planted.Trust(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cm.Data[transfer.CertsKey] += string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: theirs[0].Raw}))
		if _, err := client.CoreV1().ConfigMaps("csi").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		cas := publish(t, s, time.Now())
		if len(cas) != 1 || cas[0].Equal(theirs[0]) {
			t.Fatalf("after the signer's publication the bundle holds %d authorities", len(cas))
		}
		key, _, _ := (&SecretStore{Client: kubefake.New(client, nil), Namespace: "csi", Name: "signer-key"}).Load(ctx)
		own, _, _ := transfer.ParseAuthority(key, time.Now())
		if !cas[0].Equal(own[0]) {
			t.Fatal("the bundle is not the signer's authority")
		}
	})
}

// TestSignerRollsOverWhenAsked: a rollover asked for in the signer's
// Store happens once; both authorities are published, so certificates of
// the one before keep working until nodes have moved.
func TestSignerRollsOverWhenAsked(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	own := &transfer.MemoryStore{}
	s := &Signer{Client: kubefake.New(client, nil), Name: signerName, Driver: "d", Namespace: "csi", ServiceAccount: "node-sa",
		Authority: &transfer.StoreAuthority{Store: own, Driver: "d"}, Bundle: "trust"}
	published := func() int { t.Helper(); return len(publish(t, s, time.Now())) }
	if n := published(); n != 1 {
		t.Fatalf("%d authorities at first", n)
	}
	ask := func(v string) {
		data, version, err := own.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		next := map[string][]byte{}
		for k, b := range data {
			next[k] = b
		}
		next[RollOverKey] = []byte(v)
		if err := own.Save(ctx, next, version); err != nil {
			t.Fatal(err)
		}
	}
	// The request's time is in whole seconds: it is made in the second
	// after the authority.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	ask(time.Now().UTC().Format(time.RFC3339))
	for i := range 3 { // once, however often it publishes
		if n := published(); n != 2 {
			t.Fatalf("publication %d after the request: %d authorities, want 2", i, n)
		}
	}
	ask("next tuesday")
	if err := s.Publish(ctx); err == nil || !strings.Contains(err.Error(), RollOverKey) {
		t.Fatalf("a request that is not a time: %v", err)
	}
}

// TestSignerCacheKeepsLittle: the signer's cache keeps of a request what
// deciding needs; one larger than a node's makes is dropped (so 150 of
// 900 KiB hold no 135 MB), and Handle refuses it saying why.
func TestSignerCacheKeepsLittle(t *testing.T) {
	big := &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "big",
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: certv1.CertificateSigningRequestSpec{SignerName: signerName, Username: driverSA, Request: make([]byte, 900<<10),
			Extra: map[string]certv1.ExtraValue{NodeNameExtra: {"n1"}, PodNameExtra: {"driver-n1"}, PodUIDExtra: {"uid-driver-n1"}}}}
	obj, err := slim(big.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	kept := obj.(*certv1.CertificateSigningRequest)
	if kept.Spec.Request != nil || kept.ManagedFields != nil || kept.Spec.Username != driverSA {
		t.Fatalf("the cache keeps %d bytes of request, %d managed fields, user %q", len(kept.Spec.Request), len(kept.ManagedFields), kept.Spec.Username)
	}
	client := fake.NewClientset(kept)
	pod(t, client, "driver-n1", "n1", "node-sa", "DaemonSet")
	var reason string
	s := &Signer{Client: kubefake.New(client, nil), Name: signerName, Driver: "d", Namespace: "csi", ServiceAccount: "node-sa",
		OnDecision: func(_, _ string, granted bool, r string) { reason = r }}
	if err := s.Handle(context.Background(), kept); err != nil {
		t.Fatal(err)
	}
	got, _ := client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), "big", metav1.GetOptions{})
	if !condition(got, certv1.CertificateDenied) || !strings.Contains(reason, "larger than") {
		t.Fatalf("a 900 KiB request: denied %v, %q", condition(got, certv1.CertificateDenied), reason)
	}
}

// TestSignerRefusesExtraMetadata: the signer's cache keeps no labels or
// annotations of a request, and a request carrying any besides the one
// label a driver's has is refused saying so; a driver's own is granted.
func TestSignerRefusesExtraMetadata(t *testing.T) {
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		granted     bool
	}{
		{"a driver's label", map[string]string{"app.kubernetes.io/managed-by": "hostpath-csi"}, nil, true},
		{"none", nil, nil, true},
		{"another label", map[string]string{"app.kubernetes.io/managed-by": "hostpath-csi", "pad": strings.Repeat("x", 63)}, nil, false},
		{"an annotation", nil, map[string]string{"pad": strings.Repeat("x", 16<<10)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, der, err := transfer.NewRequest("d", "n1")
			if err != nil {
				t.Fatal(err)
			}
			req := &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "req", Labels: tc.labels, Annotations: tc.annotations},
				Spec: certv1.CertificateSigningRequestSpec{SignerName: signerName, Username: driverSA, Request: der,
					Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth, certv1.UsageServerAuth},
					Extra:  map[string]certv1.ExtraValue{NodeNameExtra: {"n1"}, PodNameExtra: {"driver-n1"}, PodUIDExtra: {"uid-driver-n1"}}}}
			obj, err := slim(req.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			kept := obj.(*certv1.CertificateSigningRequest)
			if len(kept.Annotations) != 0 || len(kept.Labels) > 1 || len(kept.Labels) == 1 && kept.Labels[extraMetaLabel] == "" {
				t.Fatalf("the cache keeps labels %v and annotations %v", kept.Labels, kept.Annotations)
			}
			client := fake.NewClientset(kept)
			pod(t, client, "driver-n1", "n1", "node-sa", "DaemonSet")
			var reason string
			s := &Signer{Client: kubefake.New(client, nil), Name: signerName, Driver: "d", Namespace: "csi", ServiceAccount: "node-sa",
				Authority:  &transfer.StoreAuthority{Store: &SecretStore{Client: kubefake.New(client, nil), Namespace: "csi", Name: "signer-key"}, Driver: "d"},
				OnDecision: func(_, _ string, granted bool, r string) { reason = r }}
			if err := s.Handle(context.Background(), kept); err != nil {
				t.Fatal(err)
			}
			got, _ := client.CertificatesV1().CertificateSigningRequests().Get(context.Background(), kept.Name, metav1.GetOptions{})
			if granted := len(got.Status.Certificate) > 0; granted != tc.granted || !tc.granted && !strings.Contains(reason, "labels or annotations") {
				t.Fatalf("granted %v (%q), want %v", granted, reason, tc.granted)
			}
			if denied := condition(got, certv1.CertificateDenied); denied == tc.granted {
				t.Fatalf("denied %v (%q), want granted %v", denied, reason, tc.granted)
			}
		})
	}
}
