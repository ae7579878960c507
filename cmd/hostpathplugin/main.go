// Command hostpathplugin is the CSI driver for node-local storage. It is
// one static binary: it starts no other program.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/kubeauth"
	"github.com/hostpath-csi/hostpath/registrar"
	"github.com/hostpath-csi/hostpath/snapimport"
)

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "hostpathplugin: %v\n", err)
		os.Exit(2)
	}
	if o.showVersion {
		fmt.Println(o.cfg.Version)
		return
	}
	switch o.mode {
	case "transfer-signer":
		os.Exit(runSigner(o))
	case "controller":
		os.Exit(runController(o))
	}
	if o.markPool != "" {
		msg, err := engine.MarkPool(o.cfg, o.markPool)
		if err != nil {
			fmt.Fprintf(os.Stderr, "hostpathplugin: %v\n", err)
			os.Exit(1)
		}
		fmt.Println(msg)
		return
	}
	for _, w := range o.warnings {
		klog.Warning(w)
	}
	os.Exit(run(o))
}

// run serves until SIGTERM/SIGINT (exit 0) or a failure (exit 1): the CSI
// server, and when asked the kubelet registration and the HTTP endpoint.
func run(o options) int {
	d, err := csi.New(o.cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hostpathplugin: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	var reg *registrar.Registrar
	if o.pluginRegistrationPath != "" {
		reg, err = registrar.New(registrar.Config{Dir: o.pluginRegistrationPath, DriverName: o.cfg.DriverName, Endpoint: o.kubeletRegistrationPath})
		if err != nil {
			fmt.Fprintf(os.Stderr, "hostpathplugin: %v\n", err)
			return 2
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.Serve(ctx); err != nil {
			cancel(fmt.Errorf("serving CSI: %w", err))
		}
	}()
	regDone := make(chan struct{})
	if reg == nil {
		close(regDone)
	} else {
		go func() {
			// Run removes the registration socket as it returns: exit
			// waits for that, or kubelet keeps a dead registration.
			defer close(regDone)
			// Register only once the CSI socket answers: kubelet calls
			// NodeGetInfo right after GetInfo.
			for d.Healthy() != nil && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
			}
			if ctx.Err() != nil {
				return
			}
			if err := reg.Run(ctx); err != nil {
				cancel(err)
			}
		}()
	}
	if o.labelImported {
		go labelImported(ctx, d, o)
	}
	if o.reportLostNodes {
		go reportLostNodes(ctx, o)
	}
	go volumeEvents(d, o)
	if o.transferEndpoint != "" {
		go servePeers(ctx, d, o)
	}
	if o.httpEndpoint != "" {
		fail := func(err error) { cancel(fmt.Errorf("http endpoint %s: %w", o.httpEndpoint, err)) }
		if stop, err := serveHTTP(o.httpEndpoint, httpHandler(d, reg, metricsGuard(o)), fail); err != nil {
			fail(err)
		} else {
			defer stop()
		}
	}
	<-ctx.Done()
	<-done
	<-regDone
	if err := d.Close(); err != nil {
		klog.ErrorS(err, "closing the state")
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		klog.ErrorS(cause, "stopping")
		klog.Flush()
		return 1
	}
	klog.InfoS("stopped")
	klog.Flush()
	return 0
}

// httpHandler serves /healthz (the CSI socket answers and, when
// registering, the registration socket is in place) and /metrics, behind
// guard when there is one.
func httpHandler(d *csi.Driver, reg *registrar.Registrar, guard *kubeauth.Guard) http.Handler {
	mux := http.NewServeMux()
	metrics := promhttp.HandlerFor(d.Registry(), promhttp.HandlerOpts{})
	if guard != nil {
		metrics = guard.Wrap(metrics)
	}
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		err := d.Healthy()
		if err == nil && reg != nil {
			err = reg.Healthy()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// metricsGuard is what guards /metrics: the API server's reviews in a
// cluster (unless --metrics-auth=false), nothing outside one (a driver run
// by hand or by csi-sanity has no API server to ask).
func metricsGuard(o options) *kubeauth.Guard {
	if !o.metricsAuth {
		return nil
	}
	_, client, ok := inClusterClient("/metrics is served to anyone who reaches the port")
	if !ok {
		return nil
	}
	return &kubeauth.Guard{Client: client}
}

// labelImported runs the labeler of imported snapshots (see snapimport)
// when the driver runs in a cluster: it needs the service account's
// credentials, which a driver run by hand or by csi-sanity does not have.
func labelImported(ctx context.Context, d *csi.Driver, o options) {
	_, client, ok := inClusterClient("imported snapshots are not labelled for this node's snapshotter")
	if !ok {
		return
	}
	l := &snapimport.Labeler{Client: client, Driver: o.cfg.DriverName, Node: o.cfg.NodeID, Holds: d.Engine().HoldsSnapshot, Resync: 10 * time.Minute,
		Labelled: func(content string, err error) {
			if err != nil {
				klog.ErrorS(err, "labelling an imported snapshot for this node", "content", content)
				return
			}
			klog.InfoS("imported snapshot labelled for this node's snapshotter", "content", content, "node", o.cfg.NodeID)
		}}
	if err := l.Run(ctx); err != nil {
		klog.ErrorS(err, "imported snapshots were not labelled")
	}
}
