package localcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// up starts the cluster from nothing (a previous one is taken down
// first) and returns once the node is Ready and the images are imported.
func (c *cluster) up() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (it mounts, makes cgroups and network namespaces)")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl", "containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := os.Stat(filepath.Join(c.bin, b)); err != nil {
			return fmt.Errorf("%s is not built (make cluster-build): %v", b, err)
		}
	}
	for _, p := range []string{"/usr/sbin/runc", "/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/usr/sbin/iptables"} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s is missing (Debian packages runc, containernetworking-plugins, iptables): %v", p, err)
		}
	}
	if _, err := os.Stat(c.path("pids")); err == nil {
		c.log("a cluster is up already; taking it down first")
		if err := c.down(); err != nil {
			return err
		}
	}
	count, err := nodeCount()
	if err != nil {
		return err
	}
	ip, err := hostAddress()
	if err != nil {
		return err
	}
	c.hostIP = ip
	for _, d := range []string{c.path("logs"), c.path("pids"), c.path("cni", "net.d"), kubeletDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// kubelet and the driver mount under /var/lib/kubelet and need those
	// mounts to reach the host: / is private on these machines. down puts
	// back what was there.
	if !rootShared() {
		if err := os.WriteFile(c.path("root-was-private"), nil, 0o644); err != nil {
			return err
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("making / rshared: %w", err)
	}
	for _, s := range []string{"net/bridge/bridge-nf-call-iptables", "net/ipv4/conf/all/route_localnet"} {
		os.WriteFile("/proc/sys/"+s, []byte("1"), 0o644) // best effort: absent without br_netfilter
	}
	// Pods talk to this machine only: anything from the pod network that
	// would be forwarded out of another interface is dropped (with several
	// nodes, the host forwards between them over their bridge).
	out := bridgeDevice
	if count > 1 {
		out = nodesBridge
		if err := bridgeUp(); err != nil {
			return err
		}
	}
	if err := fence(out); err != nil {
		return err
	}
	p, err := newPKI(c.path("pki"), ip, c.node)
	if err != nil {
		return err
	}
	server := fmt.Sprintf("https://%s:%d", ip, apiPort)
	for _, k := range []string{"admin", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet-client"} {
		if err := p.kubeconfig(c.path(k+".kubeconfig"), server, k); err != nil {
			return err
		}
	}
	c.log("PKI and kubeconfigs in %s (server %s, node %s)", c.state, server, c.node)

	if err := c.start("etcd", nil, "--data-dir", c.path("etcd"), "--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379", "--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380", "--initial-cluster", "default=http://127.0.0.1:2380",
		"--log-level", "warn", "--quota-backend-bytes", strconv.Itoa(2<<30)); err != nil {
		return err
	}
	if err := waitTCP("127.0.0.1:2379", 60*time.Second); err != nil {
		return fmt.Errorf("etcd: %w (log %s)", err, c.path("logs", "etcd.log"))
	}
	c.log("etcd serving")
	pk := p.path
	if err := c.start("kube-apiserver", nil,
		"--etcd-servers=http://127.0.0.1:2379", "--bind-address=0.0.0.0", fmt.Sprintf("--secure-port=%d", apiPort),
		"--advertise-address="+ip.String(), "--tls-cert-file="+pk("apiserver.crt"), "--tls-private-key-file="+pk("apiserver.key"),
		"--client-ca-file="+pk("ca.crt"), "--kubelet-client-certificate="+pk("apiserver-kubelet.crt"),
		"--kubelet-client-key="+pk("apiserver-kubelet.key"), "--kubelet-certificate-authority="+pk("ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local", "--service-account-key-file="+pk("sa.pub"),
		"--service-account-signing-key-file="+pk("sa.key"), "--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC", "--allow-privileged=true", "--profiling=false",
		// Kubelets by address: node names are not in any name server.
		"--kubelet-preferred-address-types=InternalIP,Hostname", "--v=1"); err != nil {
		return err
	}
	api := newAPI(server, p)
	if err := api.waitReady(120 * time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w (log %s)", err, c.path("logs", "kube-apiserver.log"))
	}
	c.log("kube-apiserver ready")
	if err := c.start("kube-controller-manager", nil, "--kubeconfig="+c.path("kube-controller-manager.kubeconfig"),
		"--authentication-kubeconfig="+c.path("kube-controller-manager.kubeconfig"),
		"--authorization-kubeconfig="+c.path("kube-controller-manager.kubeconfig"),
		"--service-account-private-key-file="+pk("sa.key"), "--root-ca-file="+pk("ca.crt"),
		"--cluster-signing-cert-file="+pk("ca.crt"), "--cluster-signing-key-file="+pk("ca.key"),
		"--use-service-account-credentials=true", "--leader-elect=false", "--bind-address=127.0.0.1",
		"--service-cluster-ip-range="+serviceCIDR, "--v=1"); err != nil {
		return err
	}
	if err := c.start("kube-scheduler", nil, "--kubeconfig="+c.path("kube-scheduler.kubeconfig"),
		"--authentication-kubeconfig="+c.path("kube-scheduler.kubeconfig"),
		"--authorization-kubeconfig="+c.path("kube-scheduler.kubeconfig"),
		"--leader-elect=false", "--bind-address=127.0.0.1", "--v=1"); err != nil {
		return err
	}
	if count > 1 {
		return c.upNodes(p, server, count)
	}
	// The driver's hdd pool is a disk of its own, as on the nodes.
	if err := makeDisk(c.path("hdd.img"), 1024, "hdd", "xfs"); err != nil {
		return err
	}
	if err := os.MkdirAll(hddPool, 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("mount", "-o", "loop", c.path("hdd.img"), hddPool).CombinedOutput(); err != nil {
		return fmt.Errorf("mounting %s on %s: %v: %s", c.path("hdd.img"), hddPool, err, out)
	}
	if err := c.startContainerd(); err != nil {
		return err
	}
	c.log("containerd serving")
	if err := c.importImages(); err != nil {
		return err
	}
	if err := c.startKubelet(p); err != nil {
		return err
	}
	if err := c.start("kube-proxy", nil, "--kubeconfig="+c.path("kube-proxy.kubeconfig"), "--cluster-cidr="+podCIDR,
		"--proxy-mode=iptables", "--hostname-override="+c.node, "--conntrack-max-per-core=0",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256", "--v=1"); err != nil {
		return err
	}
	if err := api.waitNodeReady(c.node, 180*time.Second); err != nil {
		return fmt.Errorf("node %s: %w (log %s)", c.node, err, c.path("logs", "kubelet.log"))
	}
	c.log("node %s Ready; kubectl --kubeconfig %s", c.node, c.kubeconfig())
	return nil
}

// start runs a daemon in its own session, its output in logs/NAME.log
// and its pid in pids/NAME, so down can find it after this program ends.
func (c *cluster) start(name string, env []string, args ...string) error {
	logf, err := os.OpenFile(c.path("logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	return os.WriteFile(c.path("pids", name), []byte(strconv.Itoa(pid)), 0o644)
}

func waitTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening after %v: %w", addr, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *cluster) containerdSocket() string { return c.path("containerd", "containerd.sock") }

func (c *cluster) startContainerd() error { return c.startContainerdWith(podCIDR) }

// startContainerdWith starts containerd with its state under c.state and
// pods addressed from subnet.
func (c *cluster) startContainerdWith(subnet string) error {
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q

[grpc]
  address = %q

# No NRI: nothing here uses it, and its default socket
# (/var/run/nri/nri.sock) is one path for every node's containerd, so
# two starting at once raced for it ("bind: address already in use") and
# one node never came up.
[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  # The bounding set here lacks CAP_SYS_RESOURCE: without this every
  # sandbox fails on oom_score_adj.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = %q
`, c.path("containerd", "root"), c.path("containerd", "state"), c.containerdSocket(), pauseImage, c.path("cni", "net.d"))
	if err := os.MkdirAll(c.path("containerd"), 0o711); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("containerd", "config.toml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "hostpath-test",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, bridgeDevice, subnet, c.path("cni", "ipam"))
	if err := os.WriteFile(c.path("cni", "net.d", "10-bridge.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	// containerd finds its shim on PATH.
	env := []string{"PATH=" + c.bin + ":/usr/sbin:/usr/bin:/sbin:/bin"}
	if err := c.start("containerd", env, "--config", c.path("containerd", "config.toml")); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := c.ctr("version"); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd not serving after 60s (log %s)", c.path("logs", "containerd.log"))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// ctr runs containerd's client against this cluster's containerd, in
// kubelet's namespace.
func (c *cluster) ctr(args ...string) error {
	cmd := exec.Command(filepath.Join(c.bin, "ctr"), append([]string{"--address", c.containerdSocket(), "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// importImages loads every OCI archive in the images directory.
func (c *cluster) importImages() error {
	tars, _ := filepath.Glob(filepath.Join(c.images, "*.tar"))
	sort.Strings(tars)
	if len(tars) == 0 {
		return fmt.Errorf("no images in %s (make cluster-images)", c.images)
	}
	for _, t := range tars {
		start := time.Now()
		if err := c.ctr("images", "import", "--local", t); err != nil {
			return err
		}
		c.log("imported %s (%.1fs)", filepath.Base(t), time.Since(start).Seconds())
	}
	return nil
}

func (c *cluster) startKubelet(p *pki) error {
	return c.startKubeletWith(p.dir, c.path("kubelet-client.kubeconfig"), "")
}

// startKubeletWith starts kubelet with the serving certificate in pkiDir,
// the client identity of kubeconfig, and its pods under cgroupRoot (""
// for the cgroup hierarchies' roots).
func (c *cluster) startKubeletWith(pkiDir, kubeconfig, cgroupRoot string) error {
	pk := func(name string) string { return filepath.Join(pkiDir, name) }
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 without systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
tlsCertFile: %q
tlsPrivateKeyFile: %q
failSwapOn: false
clusterDomain: cluster.local
# No resolv.conf for pods: nothing in this cluster needs a name server,
# and no pod traffic is to leave the machine.
resolvConf: ""
serializeImagePulls: false
protectKernelDefaults: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, c.containerdSocket(), pk("ca.crt"), pk("kubelet.crt"), pk("kubelet.key"))
	if cgroupRoot != "" {
		cfg += "cgroupRoot: " + cgroupRoot + "\n"
	}
	if err := os.WriteFile(c.path("kubelet.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	return c.start("kubelet", []string{"PATH=" + c.bin + ":/usr/sbin:/usr/bin:/sbin:/bin"},
		"--config="+c.path("kubelet.yaml"), "--kubeconfig="+kubeconfig,
		"--hostname-override="+c.node, "--node-ip="+c.hostIP.String(), "--root-dir="+kubeletDir, "--v=2")
}

// fenceChain holds the rule that keeps pod traffic on this machine.
const fenceChain = "HOSTPATH-TEST-FENCE"

func fence(out string) error {
	for _, args := range [][]string{
		{"-N", fenceChain},
		{"-A", fenceChain, "-s", podCIDR, "!", "-o", out, "-j", "DROP"},
		{"-A", fenceChain, "-s", nodesNet + ".0/24", "!", "-o", nodesBridge, "-j", "DROP"},
		{"-I", "FORWARD", "-j", fenceChain},
	} {
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// rootShared reports whether / is a shared mount.
func rootShared() bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 6 && f[4] == "/" {
			return strings.Contains(strings.Join(f[6:], " "), "shared:")
		}
	}
	return false
}
