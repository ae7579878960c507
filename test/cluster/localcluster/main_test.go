// Package localcluster runs a single-node Kubernetes cluster on this
// machine from binaries built by test/cluster's Makefile: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd with
// Debian's runc and CNI plugins, kubelet and kube-proxy, each a process of
// its own with a log file. No registry is needed: images come from OCI
// archives imported into containerd.
//
// up starts everything and waits for the node to be Ready; down stops
// everything and leaves no process, mount, loop device, network namespace,
// cgroup or rule behind.
//
// It is a test harness for a privileged runner (root, cgroup v1 without
// systemd), not a way to run production clusters.
package localcluster

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The cluster's fixed addresses: virtual service IPs, and a bridge for
// pods that exists only on this machine.
const (
	serviceCIDR = "10.0.0.0/24"
	serviceIP   = "10.0.0.1"
	podCIDR     = "10.88.0.0/16"
	apiPort     = 6443
	kubeletDir  = "/var/lib/kubelet"
	driverData  = "/var/lib/csi-hostpath-data"
	// poolsDir holds the driver's second pool, hdd (deploy/'s --pool
	// hdd=...): a disk image of its own on every node.
	poolsDir     = "/var/lib/csi-hostpath-pools"
	hddPool      = poolsDir + "/hdd"
	pauseImage   = "registry.k8s.io/pause:3.10"
	netnsDir     = "/var/run/netns"
	bridgeDevice = "cni0"
)

// cluster is where everything lives.
type cluster struct {
	bin, state, images string
	node               string
	hostIP             net.IP
	log                func(format string, args ...any)
}

func (c *cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.state}, parts...)...)
}

func (c *cluster) kubeconfig() string { return c.path("admin.kubeconfig") }

// The harness runs as tests, so that it may start programs (the daemons,
// ctr, iptables) as only tests and benchmarks may; make runs one of them:
//
//	make cluster-up     go test -run '^TestUp$' ./localcluster/
//	make cluster-down   go test -run '^TestDown$' ./localcluster/
//
// Both do nothing unless HOSTPATH_CLUSTER names them, so go test ./...
// never starts or stops a cluster by accident. CACHE moves the binaries,
// images and state from ~/.cache/hostpath-csi.
func TestUp(t *testing.T) { run(t, "up") }

// TestMain runs a node's init instead of the tests when up started this
// binary as one (see nodeInit).
func TestMain(m *testing.M) {
	if cfg := os.Getenv(nodeInitEnv); cfg != "" {
		if err := nodeInit(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "node init:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
func TestDown(t *testing.T) { run(t, "down") }

// TestNodeStop and TestNodeStart stop and start again the node NODE of a
// multi-node cluster (HOSTPATH_CLUSTER=node-stop, node-start).
func TestNodeStop(t *testing.T)  { run(t, "node-stop") }
func TestNodeStart(t *testing.T) { run(t, "node-start") }

func run(t *testing.T, cmd string) {
	if os.Getenv("HOSTPATH_CLUSTER") != cmd {
		t.Skipf("starts or stops the local cluster: run by make cluster-%s (HOSTPATH_CLUSTER=%s)", cmd, cmd)
	}
	home, _ := os.UserHomeDir()
	cache := filepath.Join(home, ".cache", "hostpath-csi")
	if v := os.Getenv("CACHE"); v != "" {
		cache = v
	}
	c := &cluster{bin: filepath.Join(cache, "bin"), state: filepath.Join(cache, "cluster"), images: filepath.Join(cache, "images")}
	c.node, _ = os.Hostname()
	start := time.Now()
	c.log = func(format string, args ...any) {
		fmt.Printf("[%6.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	var err error
	switch cmd {
	case "up":
		err = c.up()
	case "down":
		err = c.down()
	default:
		err = c.nodeCommand(cmd)
	}
	if err != nil {
		t.Fatalf("localcluster %s: %v", cmd, err)
	}
}

// hostAddress is the address kube-apiserver advertises: this machine's
// first global IPv4 address (traffic to it stays on the machine). Pods
// reach it through the kubernetes service, which kube-proxy translates.
func hostAddress() (net.IP, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || i.Name == bridgeDevice || i.Name == nodesBridge || strings.HasPrefix(i.Name, "hp-node-") {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.To4(), nil
			}
		}
	}
	return nil, fmt.Errorf("no global IPv4 address on any interface: kube-apiserver needs one to advertise")
}
