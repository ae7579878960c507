package main

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/kube"
	"github.com/hostpath-csi/hostpath/kubepeers"
	"github.com/hostpath-csi/hostpath/kubestandby"
	"github.com/hostpath-csi/hostpath/transfer"
)

// servePeers joins this node to the deployment's node-to-node transfer
// when the driver runs in a cluster: credentials from the transfer signer,
// a server for
// this node's sources (each served only to the node a claim for it waits
// on), and peers for restores and clones whose source is on another node.
// Outside a cluster (by hand, csi-sanity) it does nothing, and such a
// source stays ResourceExhausted.
func servePeers(ctx context.Context, d *csi.Driver, o options) {
	eng := d.Engine()
	restConfig, client, ok := inClusterClient("no node-to-node transfer; sources on other nodes cannot be restored here")
	if !ok {
		return
	}
	_, portStr, err := net.SplitHostPort(o.transferEndpoint)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil {
		klog.ErrorS(err, "no node-to-node transfer: --transfer-endpoint is not host:port", "endpoint", o.transferEndpoint)
		return
	}
	// This node's key stays here; the transfer signer grants its request
	// only for the node the pod's token is bound to.
	creds := signedCredentials(ctx, client, o, o.cfg.NodeID)
	if !obtain(ctx, creds, "node-to-node transfer credentials") {
		return
	}
	ln, err := net.Listen("tcp", o.transferEndpoint)
	if err != nil {
		klog.ErrorS(err, "no node-to-node transfer")
		return
	}
	go keepFresh(ctx, creds, "node-to-node transfer credentials")
	res := &kubepeers.Resolver{Client: client, Driver: o.cfg.DriverName, Port: port, KeyOf: engine.NodeTag}
	eng.SetPeers(&transfer.Peers{Client: &transfer.Client{Creds: creds}, Resolve: res.Resolve})
	klog.InfoS("serving this node's sources to the other nodes", "endpoint", o.transferEndpoint, "certificateUntil", creds.Expiry())
	dyn, err := dynamic.NewForConfig(restConfig)
	if err != nil {
		klog.ErrorS(err, "no node-to-node transfer: no client for ReferenceGrants")
		return
	}
	// A peer is authorized from this node's own records of its sources.
	owners := func(kind, id string) (kubepeers.Owner, bool, bool) {
		o, here, ok := eng.SourceOwner(kind, id)
		owner := kubepeers.Owner{Namespace: o.Namespace, Name: o.Name, Object: o.Content, Group: o.Group}
		if kind == engine.SourceSnapshot {
			owner.Source = eng.SnapshotSourceVolume(id)
		}
		return owner, here, ok
	}
	pending := &kubepeers.Pending{Client: client, Driver: o.cfg.DriverName,
		Node: o.cfg.NodeID, TopologyKey: csi.TopologyKey, Owners: owners, Grants: kubepeers.Grants{Client: dyn}.Allows,
		SnapshotKind: engine.SourceSnapshot, VolumeKind: engine.SourceVolume}
	// A peer gets a source only while a claim to be filled from it waits
	// on the peer's node; refusals are logged here, since the peer is
	// told only that it was refused.
	authz := transfer.AuthorizerFunc(func(ctx context.Context, peer, kind, id string) error {
		if kind == engine.SourceEpoch {
			return eng.AuthorizeEpoch(peer, id)
		}
		if kind == engine.SourceStandby || kind == engine.SourceHandover || kind == engine.SourceHanded {
			// A standby copy goes only to the node this node's own
			// record of the volume names.
			err := eng.AuthorizeStandby(peer, id)
			if err != nil {
				klog.InfoS("changed blocks were refused to another node: this node's record names another standby, or none", "peer", peer, "id", id, "err", err)
			}
			return err
		}
		err := pending.Authorize(ctx, peer, kind, id)
		if err != nil {
			klog.InfoS("a source was refused to another node: no claim to be filled from it waits on that node", "peer", peer, "kind", kind, "id", id, "err", err)
		}
		return err
	})
	keepStandbys(ctx, eng, client, res, o)
	if o.controlEndpoint != "" {
		go serveControl(ctx, d, creds, o.controlEndpoint)
	}
	srv := &transfer.Server{Creds: creds, Source: eng.TransferSource(), Authorizer: authz}
	if err := srv.Serve(ctx, ln); err != nil {
		klog.ErrorS(err, "node-to-node transfer stopped")
	}
}

// keepStandbys lets this node's volumes have standby copies on the other
// nodes running the driver, and keeps the copies this node keeps of
// theirs: those the PVs name it for (kubestandby), caught up at their
// intervals (docs/standby.md).
func keepStandbys(ctx context.Context, eng *engine.Engine, client kube.Interface, res *kubepeers.Resolver, o options) {
	eng.SetStandbyNodes(res.Nodes)
	eng.SetFences(kubestandby.Fences(client))
	w := &kubestandby.Watcher{Client: client, Driver: o.cfg.DriverName, Node: o.cfg.NodeID,
		Add: func(s engine.StandbySpec) error {
			if known, ok := eng.Records.Standbys.Get(s.Volume); ok && known.Primary == s.Primary {
				return nil // every update of its PV says it again
			}
			if _, err := eng.AddStandby(s); err != nil {
				return err
			}
			klog.InfoS("keeping a standby copy of another node's volume", "volume", s.Volume, "primary", s.Primary, "pv", s.PV, "interval", s.Interval)
			return nil
		},
		Drop: func(id string) error {
			klog.InfoS("the PV of a standby copy is gone: the copy is removed", "volume", id)
			return eng.DropStandby(id)
		},
		Kept: func() map[string]string {
			out := map[string]string{}
			for _, s := range eng.Records.Standbys.All() {
				out[s.Volume] = s.PV
			}
			return out
		},
		OnErr: func(err error) { klog.ErrorS(err, "standby copies") },
	}
	go func() {
		if err := w.Run(ctx); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "standby copies are not kept: the PVs cannot be watched")
		}
	}()
	// The first pull of each copy since start is logged: after a restart,
	// a return from a failover or a move it says how much had to travel
	// (base 0: the whole image); the later ones only at -v=4.
	var pulled sync.Map
	go eng.RunStandbys(ctx, func(id string, st engine.StandbyState, err error) {
		if ctx.Err() != nil {
			return // stopping: the pull was cut short on purpose
		}
		if err != nil {
			klog.ErrorS(err, "a standby copy did not catch up; it is tried again at its next interval", "volume", id)
			return
		}
		if _, again := pulled.LoadOrStore(id, true); !again {
			klog.InfoS("standby copy caught up, the first time since start", "volume", id, "generation", st.Generation, "base", st.Base, "bytes", st.Bytes)
			return
		}
		klog.V(4).InfoS("standby copy caught up", "volume", id, "generation", st.Generation, "base", st.Base, "bytes", st.Bytes)
	})
}

// signedCredentials are who's transfer credentials (a node's name, or
// transfer.ControllerPeer), issued by the transfer signer through the CSR
// API; the key never leaves this process.
func signedCredentials(ctx context.Context, client kube.Interface, o options, who string) *transfer.Credentials {
	csrs := &kubepeers.CSRAuthority{Client: client, Signer: signerName(o.cfg.DriverName), Namespace: namespace(), Bundle: o.transferTrust}
	var err error
	if csrs.Owner, err = kubepeers.CSIDriverOwner(ctx, client, o.cfg.DriverName); err != nil {
		klog.ErrorS(err, "certificate requests get no owner: uninstalling the driver leaves those the signer has not swept yet", "for", who)
	}
	return &transfer.Credentials{Driver: o.cfg.DriverName, Node: who, Authority: csrs, LeafLifetime: transfer.DefaultSignedLifetime}
}

// obtain gets creds their first certificate, retrying with backoff; false
// when ctx ended first.
func obtain(ctx context.Context, creds *transfer.Credentials, what string) bool {
	for backoff := time.Second; ; backoff = min(2*backoff, time.Minute) {
		err := creds.Refresh(ctx)
		if err == nil {
			klog.InfoS("certificate from the transfer signer", "for", what, "until", creds.Expiry())
			return true
		}
		klog.ErrorS(err, what+"; retrying", "in", backoff)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
	}
}

// keepFresh renews creds until ctx ends (the current ones stay in use
// while a renewal fails).
func keepFresh(ctx context.Context, creds *transfer.Credentials, what string) {
	creds.Run(ctx, time.Minute, func(err error) {
		klog.ErrorS(err, "refreshing "+what+" (the current ones stay in use)")
	})
}

// namespace is the driver pod's namespace: POD_NAMESPACE (the downward
// API), else the service account's.
func namespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return "default"
}

// inClusterClient is a client for the API server through the pod's
// service account, and its config (for the clients of other APIs).
// Outside a cluster (by hand, csi-sanity) there is none; without says, in
// the log, what the caller then leaves undone.
func inClusterClient(without string) (*rest.Config, kube.Interface, bool) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		klog.V(2).InfoS("not in a cluster: "+without, "reason", err)
		return nil, nil, false
	}
	client, err := kube.NewForConfig(cfg)
	if err != nil {
		klog.ErrorS(err, without)
		return nil, nil, false
	}
	return cfg, client, true
}
