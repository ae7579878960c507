package kubepeers

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/hostpath-csi/hostpath/kube"
	"github.com/hostpath-csi/hostpath/transfer"
)

// NodeNameExtra is where the API server records, in a request made with
// a service-account token bound to a pod, the node that pod runs on (the
// token's node-bound claims). A certificate request's spec.extra is the
// requester's as the API server authenticated it: no requester can write
// it.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// PodNameExtra and PodUIDExtra are where the API server records the pod
// a token is bound to. A token bound to a Node object (kubectl create
// token --bound-object-kind=Node) carries the node's name too, but no
// pod: the signer grants only tokens of a pod it can check.
const (
	PodNameExtra = "authentication.kubernetes.io/pod-name"
	PodUIDExtra  = "authentication.kubernetes.io/pod-uid"
)

// DefaultMaxCertLifetime is the longest a Signer signs for.
const DefaultMaxCertLifetime = 6 * time.Hour

// Signer approves and signs the transfer's certificate requests made
// through the Kubernetes CSR API for its signer name. It grants a request
// only when the API server's own record of the requester ties it to the
// node the request names: the requester is the drivers' service account,
// with a token bound to a pod on that node, and the request asks for
// exactly that node's certificate (transfer.CheckRequest). It is the only
// holder of the signing key (its Authority's Store, a Secret only its own
// service account may read), and publishes the authorities to trust in a
// ConfigMap the nodes read and only it writes.
type Signer struct {
	Client kube.Interface
	// Name is the signer name requests ask for (DRIVER/transfer).
	Name   string
	Driver string
	// Namespace and ServiceAccount are the drivers' service account: the
	// only requester granted a node's certificate.
	Namespace, ServiceAccount string
	// ControllerServiceAccount, in Namespace, is the controller's
	// (--mode=controller): the only requester granted the controller's
	// certificate (transfer.ControllerPeer), and only from a pod of a
	// ReplicaSet (its Deployment's). Empty: none is granted.
	ControllerServiceAccount string
	// Authority holds the signing key and rolls it over.
	Authority *transfer.StoreAuthority
	// Bundle is the ConfigMap, in Namespace, where the authorities to
	// trust are published (transfer.CertsKey); BundleOwner, when set, owns
	// it (the signer's Deployment).
	Bundle      string
	BundleOwner *metav1.OwnerReference
	// MaxLifetime caps what is signed; zero means DefaultMaxCertLifetime.
	MaxLifetime time.Duration
	// OnDecision, when set, is told of every request granted or refused
	// (the Signer itself never logs).
	OnDecision func(csr, node string, granted bool, reason string)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (s *Signer) requester() string {
	return "system:serviceaccount:" + s.Namespace + ":" + s.ServiceAccount
}

// allowedUsages are what a node's certificate is for.
var allowedUsages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth, certv1.UsageServerAuth}

// decide returns the node a request may have a certificate for, or why
// it may not (refused); err is a failure to look (the request is
// retried).
func (s *Signer) decide(ctx context.Context, csr *certv1.CertificateSigningRequest) (node string, refused, err error) {
	if s.ControllerServiceAccount != "" && csr.Spec.Username == "system:serviceaccount:"+s.Namespace+":"+s.ControllerServiceAccount {
		return s.decideController(ctx, csr)
	}
	if csr.Spec.Username != s.requester() {
		return "", fmt.Errorf("asked by %q, not by the drivers' service account %s", csr.Spec.Username, s.requester()), nil
	}
	nodes := csr.Spec.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", fmt.Errorf("the requester's token is bound to no node (%s is %v): only a driver pod's own token, bound to its pod, is granted", NodeNameExtra, nodes), nil
	}
	node = nodes[0]
	refused, err = s.check(ctx, csr, requesterPod{who: node, node: node, account: s.ServiceAccount, kind: "DaemonSet", what: "a driver"})
	return node, refused, err
}

// requesterPod is what a request's token must be bound to: a pod of
// account, on node (any, when empty), controlled by an apps/ object of
// kind, for a certificate of who (a node's name or
// transfer.ControllerPeer).
type requesterPod struct {
	who, node, account, kind, what string
}

// check decides a request for want's certificate: its usages, its size
// and content (transfer.CheckRequest), and the pod its token is bound to,
// which must exist now with that UID.
func (s *Signer) check(ctx context.Context, csr *certv1.CertificateSigningRequest, want requesterPod) (refused, err error) {
	for _, u := range csr.Spec.Usages {
		if !slices.Contains(allowedUsages, u) {
			return fmt.Errorf("it asks for usage %q", u), nil
		}
	}
	if !plainMeta(csr) {
		return fmt.Errorf("it carries labels or annotations besides app.kubernetes.io/managed-by=hostpath-csi, which %s's request never does", want.what), nil
	}
	if csr.Spec.Request == nil {
		return fmt.Errorf("its request is larger than the %d bytes %s's is", transfer.MaxRequestBytes, want.what), nil
	}
	if _, err := transfer.CheckRequest(csr.Spec.Request, s.Driver, want.who); err != nil {
		if want.node != "" {
			return fmt.Errorf("asked from node %s: %w", want.node, err), nil
		}
		return fmt.Errorf("asked by %s's account: %w", want.what, err), nil
	}
	names, uids := csr.Spec.Extra[PodNameExtra], csr.Spec.Extra[PodUIDExtra]
	if len(names) != 1 || len(uids) != 1 || names[0] == "" || uids[0] == "" {
		return fmt.Errorf("the requester's token is bound to no pod (%s %v, %s %v): only %s pod's own token is granted", PodNameExtra, names, PodUIDExtra, uids, want.what), nil
	}
	pod, err := s.Client.Pods(s.Namespace).Get(ctx, names[0], metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("the token's pod %s/%s does not exist", s.Namespace, names[0]), nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up the requester's pod %s/%s: %w", s.Namespace, names[0], err)
	}
	owner := metav1.GetControllerOf(pod)
	switch {
	case string(pod.UID) != uids[0]:
		return fmt.Errorf("the token's pod %s is not the pod of that name now (uid %s, not %s)", names[0], pod.UID, uids[0]), nil
	case want.node != "" && pod.Spec.NodeName != want.node:
		return fmt.Errorf("the token's pod %s runs on %q, not node %s", names[0], pod.Spec.NodeName, want.node), nil
	case pod.Spec.ServiceAccountName != want.account:
		return fmt.Errorf("the token's pod %s runs as %q, not %s", names[0], pod.Spec.ServiceAccountName, want.account), nil
	case owner == nil || owner.Kind != want.kind || !strings.HasPrefix(owner.APIVersion, "apps/"):
		return fmt.Errorf("the token's pod %s is not %s pod (a %s's)", names[0], want.what, want.kind), nil
	}
	return nil, nil
}

// decideController decides a request of the controller's service
// account: for the controller's certificate, from a token bound to a pod
// of that account that a ReplicaSet owns (its Deployment's).
func (s *Signer) decideController(ctx context.Context, csr *certv1.CertificateSigningRequest) (string, error, error) {
	refused, err := s.check(ctx, csr, requesterPod{who: transfer.ControllerPeer, account: s.ControllerServiceAccount, kind: "ReplicaSet", what: "a controller"})
	return transfer.ControllerPeer, refused, err
}

func condition(csr *certv1.CertificateSigningRequest, t certv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status != corev1.ConditionFalse {
			return true
		}
	}
	return false
}

// decided reports whether a request was signed, denied or failed.
func decided(csr *certv1.CertificateSigningRequest) bool {
	return len(csr.Status.Certificate) > 0 || condition(csr, certv1.CertificateDenied) || condition(csr, certv1.CertificateFailed)
}

// Handle decides one request: it is denied, or approved and signed. A
// request of another signer, or decided already, is left as it is.
func (s *Signer) Handle(ctx context.Context, csr *certv1.CertificateSigningRequest) error {
	if csr.Spec.SignerName != s.Name || decided(csr) {
		return nil
	}
	csr = csr.DeepCopy()
	node, err, lookErr := s.decide(ctx, csr)
	if lookErr != nil {
		return lookErr
	}
	if err != nil {
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type: certv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "NotThisNode",
			Message: "refused by " + s.Name + ": " + err.Error(), LastUpdateTime: metav1.Now(),
		})
		_, uerr := s.Client.CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		s.tell(csr.Name, node, false, err.Error())
		return uerr
	}
	if !condition(csr, certv1.CertificateApproved) {
		csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
			Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "NodeBoundToken",
			Message: "the requester's token is bound to a pod on node " + node + ", the node the request names", LastUpdateTime: metav1.Now(),
		})
		if csr, err = s.Client.CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	life := s.maxLifetime()
	if e := csr.Spec.ExpirationSeconds; e != nil && time.Duration(*e)*time.Second < life {
		life = time.Duration(*e) * time.Second
	}
	der, err := s.Authority.Issue(ctx, node, csr.Spec.Request, life)
	if err != nil {
		return fmt.Errorf("signing %s for node %s: %w", csr.Name, node, err)
	}
	csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if _, err := s.Client.CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		return err
	}
	s.tell(csr.Name, node, true, fmt.Sprintf("signed for %s", life))
	return nil
}

func (s *Signer) maxLifetime() time.Duration {
	if s.MaxLifetime > 0 {
		return s.MaxLifetime
	}
	return DefaultMaxCertLifetime
}

func (s *Signer) tell(csr, node string, granted bool, reason string) {
	if s.OnDecision != nil {
		s.OnDecision(csr, node, granted, reason)
	}
}

// Publish makes or rolls over the authority as needed and writes the
// authorities to trust, newest first, into the Bundle ConfigMap when they
// changed.
func (s *Signer) Publish(ctx context.Context) error {
	// The signer's own record, read once: what it keeps beside its
	// authority (a rollover asked).
	data, _, err := s.Authority.Store.Load(ctx)
	if err != nil && !errors.Is(err, transfer.ErrNoAuthority) {
		return err
	}
	rec, err := parseRecord(data)
	if err != nil {
		return err
	}
	now := s.now()
	cas, err := s.Authority.RollOver(ctx, rec.due(now))
	if err != nil {
		return err
	}
	var certs []byte
	for _, ca := range cas {
		certs = append(certs, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})...)
	}
	cms := s.Client.ConfigMaps(s.Namespace)
	cm, err := cms.Get(ctx, s.Bundle, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: s.Bundle, Namespace: s.Namespace,
				Labels:      map[string]string{"app.kubernetes.io/managed-by": "hostpath-csi"},
				Annotations: map[string]string{"hostpath.csi/what": "the authorities the drivers' node-to-node transfer trusts, published by its signer (" + s.Name + "), which alone writes it"}},
			Data: map[string]string{transfer.CertsKey: string(certs)},
		}
		if s.BundleOwner != nil {
			cm.OwnerReferences = []metav1.OwnerReference{*s.BundleOwner}
		}
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if bytes.Equal([]byte(cm.Data[transfer.CertsKey]), certs) {
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[transfer.CertsKey] = string(certs)
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

// Run publishes the authorities (again every minute, rolling them over
// when due) and decides every request for its signer name as it comes,
// until ctx ends. onErr is told of failures, which are retried; onReady
// (when set) that the authorities are published and requests are being
// decided.
func (s *Signer) Run(ctx context.Context, onErr func(error), onReady func()) error {
	if err := s.Publish(ctx); err != nil {
		return fmt.Errorf("publishing the transfer's authorities: %w", err)
	}
	inf := kube.Informer(s.Client, s.Client.CertificateSigningRequests(), &certv1.CertificateSigningRequest{}, 10*time.Minute,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", s.Name).String()
		})
	// The cache keeps of each request only what deciding it needs: 150
	// requests of 900 KiB each would otherwise be held whole.
	if err := inf.SetTransform(slim); err != nil {
		return err
	}
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if csr, ok := obj.(*certv1.CertificateSigningRequest); ok && csr.Spec.SignerName == s.Name {
			queue.Add(csr.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	var informing sync.WaitGroup
	informing.Go(func() { inf.Run(ctx.Done()) })
	defer informing.Wait() // Run returns once ctx is done, as the queue does
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	cached := func() []*certv1.CertificateSigningRequest {
		var out []*certv1.CertificateSigningRequest
		for _, obj := range inf.GetStore().List() {
			if csr, ok := obj.(*certv1.CertificateSigningRequest); ok {
				out = append(out, csr)
			}
		}
		return out
	}
	if onReady != nil {
		onReady()
	}
	go func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				queue.ShutDown()
				return
			case <-t.C:
				if err := s.Publish(ctx); err != nil && onErr != nil {
					onErr(fmt.Errorf("publishing the transfer's authorities: %w", err))
				}
				s.sweep(ctx, cached(), onErr)
			}
		}
	}()
	for {
		name, shutdown := queue.Get()
		if shutdown {
			return ctx.Err()
		}
		err := func() error {
			obj, found, err := inf.GetStore().GetByKey(name)
			if err != nil {
				return err
			}
			csr, ok := obj.(*certv1.CertificateSigningRequest)
			if !found || !ok {
				return nil
			}
			return s.Handle(ctx, csr)
		}()
		if err != nil && !errors.Is(err, context.Canceled) {
			if onErr != nil {
				onErr(fmt.Errorf("certificate request %s: %w", name, err))
			}
			queue.AddRateLimited(name)
		} else {
			queue.Forget(name)
		}
		queue.Done(name)
	}
}

// RollOverKey is the key of the signer's Store that asks for a rollover: an RFC 3339
// time, after which the newest authority must have been made (kubectl
// patch secret ... -p '{"stringData":{"rollover-requested":"<now>"}}').
// The authority replaced stays trusted for the Store's RetireAfter (see
// RetireAfter), until every node has moved and what it signed has ended;
// to stop trusting it at once, delete the Secret instead.
const RollOverKey = "rollover-requested"

// sweepAfter is how long a decided request is kept: its node reads its
// certificate within moments (it polls every half second).
const sweepAfter = 5 * time.Minute

// sweep deletes the requests of its signer name decided more than
// sweepAfter ago, so nodes need no delete permission on requests (which
// cannot be narrowed to their own) and an uninstall leaves few.
func (s *Signer) sweep(ctx context.Context, csrs []*certv1.CertificateSigningRequest, onErr func(error)) {
	for _, csr := range csrs {
		if csr.Spec.SignerName != s.Name || !decided(csr) || time.Since(csr.CreationTimestamp.Time) < sweepAfter {
			continue
		}
		err := s.Client.CertificateSigningRequests().Delete(ctx, csr.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) && onErr != nil {
			onErr(fmt.Errorf("deleting the decided request %s: %w", csr.Name, err))
		}
	}
}

// extraMetaLabel marks, in the signer's cache, a request that carried
// labels or annotations besides the one label a driver's request has.
const extraMetaLabel = "hostpath.csi/extra-metadata"

// plainMeta reports whether a request's labels and annotations are what a
// driver's own request carries (requestCertificate): the managed-by label
// or nothing.
func plainMeta(csr *certv1.CertificateSigningRequest) bool {
	return len(csr.Annotations) == 0 && (len(csr.Labels) == 0 || maps.Equal(csr.Labels, requestLabels))
}

// requestLabels are the labels of a driver's certificate request.
var requestLabels = map[string]string{"app.kubernetes.io/managed-by": "hostpath-csi"}

// slim is the signer's cache's copy of a request: no managed fields, no
// issued certificate, and a request larger than a node's makes dropped
// (decide refuses it).
func slim(obj any) (any, error) {
	csr, ok := obj.(*certv1.CertificateSigningRequest)
	if !ok {
		return obj, nil
	}
	csr.ManagedFields = nil
	// No labels or annotations are kept (a few hundred requests carrying
	// a MiB of them each would fill the signer's memory): only whether
	// they were what a driver's request carries, for check to refuse the
	// rest.
	if plainMeta(csr) {
		csr.Labels = nil
	} else {
		csr.Labels = map[string]string{extraMetaLabel: "true"}
	}
	csr.Annotations = nil
	if len(csr.Status.Certificate) > 0 {
		csr.Status.Certificate = []byte{0} // decided: what it holds is not needed
	}
	if len(csr.Spec.Request) > transfer.MaxRequestBytes {
		csr.Spec.Request = nil
	}
	return csr, nil
}
