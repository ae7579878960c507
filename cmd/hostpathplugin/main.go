// Command hostpathplugin is the CSI driver for node-local storage. It is
// one static binary: it starts no other program.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/csi"
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
	d, err := csi.New(o.cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hostpathplugin: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Serve(ctx); err != nil {
		klog.ErrorS(err, "serving CSI")
		klog.Flush()
		os.Exit(1)
	}
	klog.InfoS("stopped")
	klog.Flush()
}
