// Command localcluster runs a single-node Kubernetes cluster on this
// machine from binaries built by test/cluster's Makefile: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, containerd with
// Debian's runc and CNI plugins, kubelet and kube-proxy, each a process of
// its own with a log file. No registry is needed: images come from OCI
// archives imported into containerd.
//
//	localcluster up     start everything, wait for the node to be Ready
//	localcluster down   stop everything and leave no process, mount, loop
//	                    device, network namespace, cgroup or rule behind
//
// It is a test harness for a privileged runner (root, cgroup v1 without
// systemd), not a way to run production clusters.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The cluster's fixed addresses: virtual service IPs, and a bridge for
// pods that exists only on this machine.
const (
	serviceCIDR  = "10.0.0.0/24"
	serviceIP    = "10.0.0.1"
	podCIDR      = "10.88.0.0/16"
	apiPort      = 6443
	kubeletDir   = "/var/lib/kubelet"
	driverData   = "/var/lib/csi-hostpath-data"
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

func main() {
	home, _ := os.UserHomeDir()
	cache := filepath.Join(home, ".cache", "hostpath-csi")
	if v := os.Getenv("CACHE"); v != "" {
		cache = v
	}
	c := &cluster{}
	fs := flag.NewFlagSet("localcluster", flag.ExitOnError)
	fs.StringVar(&c.bin, "bin", filepath.Join(cache, "bin"), "directory of the built binaries")
	fs.StringVar(&c.state, "state", filepath.Join(cache, "cluster"), "directory for the cluster's state and logs")
	fs.StringVar(&c.images, "images", filepath.Join(cache, "images"), "directory of OCI archives to import")
	fs.StringVar(&c.node, "node", "", "node name (default: the host name)")
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: localcluster up|down|kubeconfig [flags]")
		os.Exit(2)
	}
	cmd := os.Args[1]
	fs.Parse(os.Args[2:])
	if c.node == "" {
		h, _ := os.Hostname()
		c.node = h
	}
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
	case "kubeconfig":
		fmt.Println(c.kubeconfig())
	default:
		err = fmt.Errorf("unknown command %q: want up, down or kubeconfig", cmd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcluster %s: %v\n", cmd, err)
		os.Exit(1)
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
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || i.Name == bridgeDevice {
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
