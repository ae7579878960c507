package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/kubepeers"
	"github.com/hostpath-csi/hostpath/transfer"
)

// signerOptions are the transfer-signer mode's.
type signerOptions struct {
	requester, keySecret, controller string
	maxLifetime                      time.Duration
}

// signerName is the CSR API signer name of a driver's transfer.
func signerName(driver string) string { return driver + "/transfer" }

// runSigner approves and signs the nodes' transfer certificates until
// SIGTERM (exit 0) or a failure (exit 1). It runs in a cluster only.
func runSigner(o options) int {
	_, client, ok := inClusterClient("the transfer signer runs only in a cluster")
	if !ok {
		fmt.Fprintln(os.Stderr, "hostpathplugin: --mode=transfer-signer runs only in a cluster (no in-cluster service account here)")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ns := namespace()
	own := &kubepeers.SecretStore{Client: client, Namespace: ns, Name: o.signer.keySecret}
	if pod := os.Getenv("POD_NAME"); pod != "" {
		// The Deployment owns the key and the bundle: uninstalling the
		// deployment deletes them (its ReplicaSets come and go).
		owner, err := kubepeers.DeploymentOf(ctx, client, ns, pod)
		if err != nil {
			klog.ErrorS(err, "the transfer signer's Secret gets no owner, so deleting the deployment leaves it", "pod", pod)
		}
		own.Owner = owner
	}
	s := &kubepeers.Signer{
		Client: client, Name: signerName(o.cfg.DriverName), Driver: o.cfg.DriverName,
		Namespace: ns, ServiceAccount: o.signer.requester, ControllerServiceAccount: o.signer.controller,
		Authority: &transfer.StoreAuthority{Store: own, Driver: o.cfg.DriverName, RetireAfter: kubepeers.RetireAfter(o.signer.maxLifetime)},
		Bundle:    o.transferTrust, BundleOwner: own.Owner,
		MaxLifetime: o.signer.maxLifetime,
		OnDecision: func(csr, node string, granted bool, reason string) {
			if granted {
				klog.InfoS("transfer certificate signed", "request", csr, "node", node, "detail", reason)
			} else {
				klog.InfoS("transfer certificate request refused", "request", csr, "node", node, "reason", reason)
			}
		},
	}
	var ready atomic.Bool
	defer serveReady(o.httpEndpoint, func() error {
		if !ready.Load() {
			return errors.New("the authorities are not published yet")
		}
		return nil
	})()
	klog.InfoS("transfer signer starting", "signer", s.Name, "requester", "system:serviceaccount:"+ns+":"+o.signer.requester, "maxLifetime", o.signer.maxLifetime, "trust", o.transferTrust)
	for backoff := time.Second; ; backoff = min(2*backoff, time.Minute) {
		err := s.Run(ctx, func(err error) { klog.ErrorS(err, "transfer signer (retried)") }, func() { ready.Store(true) })
		if ctx.Err() != nil {
			klog.InfoS("stopped")
			klog.Flush()
			return 0
		}
		klog.ErrorS(err, "transfer signer; retrying", "in", backoff)
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(backoff):
		}
	}
}
