package main

import (
	"context"
	"time"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/csi"
	"github.com/hostpath-csi/hostpath/lostnodes"
)

// reportLostNodes tells pods that wait for a volume on a node that left
// the cluster which node they wait for (lostnodes), every 30 s: the
// scheduler's event names only the PV's node affinity. Outside a cluster
// it does nothing.
func reportLostNodes(ctx context.Context, o options) {
	_, client, ok := inClusterClient("pods waiting for a lost node are not told which")
	if !ok {
		return
	}
	w := &lostnodes.Watcher{Client: client, Driver: o.cfg.DriverName, TopologyKey: csi.TopologyKey, Self: o.cfg.NodeID}
	w.Run(ctx, 30*time.Second, func(told []lostnodes.Lost, err error) {
		for _, l := range told {
			klog.InfoS("waits for a node that left the cluster", "kind", l.Object.Kind, "object", klog.KRef(l.Object.Namespace, l.Object.Name), "volume", l.Volume, "node", l.Node)
		}
		if err != nil {
			klog.ErrorS(err, "looking for pods that wait for a lost node")
		}
	})
}
