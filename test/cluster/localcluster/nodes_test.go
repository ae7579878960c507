package localcluster

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// With NODES=N (N > 1) every node is a set of namespaces of its own, as
// kind makes with containers: mount (its own /var/lib/kubelet, containerd
// directories, pod logs and the driver's state dir on a file-system image
// of its own size), network (a veth to the host bridge nodesBridge, an
// address in nodesNet, its pods' subnet routed to it by the host), PID (a
// small init, nodeInit, as PID 1: hostPID pods and nsenter see that node)
// and UTS (the node's name). In them run the node's containerd, kubelet
// (under a cgroup root of its own) and kube-proxy. The control plane
// stays in the host's namespaces.
const (
	nodesBridge = "hpnodes0"
	nodesNet    = "10.89.0"           // .1 is the host, .K+1 node K
	bridgeMAC   = "02:68:70:00:00:01" // locally administered, fixed (bridgeUp)
	nodeInitEnv = "HOSTPATH_NODE_INIT"
)

// node is one node of a multi-node cluster.
type node struct {
	Name    string
	Index   int    // 1..N
	Dir     string // everything of the node under the cluster's state
	IP      string
	PodCIDR string
	DiskMiB int
	HddMiB  int    // the hdd pool's disk
	Bin     string // the cluster's binaries
	Images  string
	PodNet  string // the whole pod network, for kube-proxy
}

// nodeCount is NODES (1 when unset).
func nodeCount() (int, error) {
	v := os.Getenv("NODES")
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 9 {
		return 0, fmt.Errorf("NODES=%q: want 1 to 9", v)
	}
	return n, nil
}

// nodeDirs are the node's own directories, bound over the host's paths in
// its mount namespace.
var nodeDirs = map[string]string{
	kubeletDir:            "kubelet",
	"/run/containerd":     "run-containerd",
	"/var/log/pods":       "log-pods",
	"/var/log/containers": "log-containers",
	netnsDir:              "netns",
	"/mnt/disks":          "disks",
}

func (c *cluster) nodes(n int) []*node {
	var out []*node
	for k := 1; k <= n; k++ {
		out = append(out, &node{
			Name: fmt.Sprintf("node-%d", k), Index: k, Dir: c.path("nodes", fmt.Sprintf("node-%d", k)),
			IP: fmt.Sprintf("%s.%d", nodesNet, k+1), PodCIDR: fmt.Sprintf("10.88.%d.0/24", k),
			// Different sizes, so capacities differ between nodes.
			DiskMiB: 2048 * (k + 1), Bin: c.bin, Images: c.images, PodNet: podCIDR,
			// The other way round: the node with the smallest state
			// disk has the largest hdd pool.
			HddMiB: 1024 * (n + 1 - k),
		})
	}
	return out
}

// makeDisk makes a sparse image of mib MiB holding a file system of
// fstype: ext4 for the state dir (a pool that cannot share blocks, as on
// most nodes), XFS for the hdd pool (one that can: reflinked snapshots and
// standby copies).
func makeDisk(img string, mib int, label, fstype string) error {
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	f.Close()
	if err := os.Truncate(img, int64(mib)<<20); err != nil {
		return err
	}
	args := []string{"-q", "-F", "-L", label, img}
	if fstype == "xfs" {
		args = []string{"-q", "-f", "-L", label, img} // reflink=1, mkfs.xfs's default
	}
	if out, err := exec.Command("mkfs."+fstype, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.%s %s: %v: %s", fstype, img, err, out)
	}
	return nil
}

func (n *node) path(parts ...string) string {
	return filepath.Join(append([]string{n.Dir}, parts...)...)
}

func (n *node) cgroupRoot() string { return "/hostpath-" + n.Name }

// startNode makes the node's disk image and directories, starts its init
// in new namespaces, wires its network from the host side and lets it go
// on to start containerd, kubelet and kube-proxy.
func (c *cluster) startNode(n *node, p *pki, server string) error {
	for _, d := range nodeDirs {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	for _, d := range []string{"logs", "pids", "cni/net.d", "containerd"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := makeDisk(n.path("disk.img"), n.DiskMiB, n.Name, "ext4"); err != nil {
		return err
	}
	if err := makeDisk(n.path("hdd.img"), n.HddMiB, n.Name+"-hdd", "xfs"); err != nil {
		return err
	}
	if err := p.issueNode(n, server); err != nil {
		return err
	}
	cfg, err := json.Marshal(n)
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.path("node.json"), cfg, 0o644); err != nil {
		return err
	}
	return launchNode(n)
}

// launchNode starts the node's init in new namespaces, wires its network
// from the host side and lets it go on: at up, or to bring back a node
// that was stopped, with its disk and directories as they were.
func launchNode(n *node) error {
	// kubelet refuses a cgroup root that does not exist.
	for _, h := range cgroupHierarchies() {
		if err := os.MkdirAll(filepath.Join(h, n.cgroupRoot()), 0o755); err != nil {
			return err
		}
	}
	cfg, err := json.Marshal(n)
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(n.path("logs", "init.log"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	defer w.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// The test binary is removed when go test ends; the init runs on
	// from its open executable. Clone flags, not unshare: Go makes / of
	// an unshared mount namespace private, and the init wants it slave.
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), nodeInitEnv+"="+string(cfg))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &unix.SysProcAttr{Setsid: true,
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWNET | unix.CLONE_NEWPID | unix.CLONE_NEWUTS}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the init of %s: %w", n.Name, err)
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	if err := os.WriteFile(n.path("pids", "init"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return err
	}
	host := "hp-" + n.Name
	for _, args := range [][]string{
		{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(pid)},
		{"link", "set", host, "master", nodesBridge, "up"},
		{"route", "replace", n.PodCIDR, "via", n.IP},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if _, err := w.Write([]byte{1}); err != nil {
		return fmt.Errorf("the init of %s: %w (log %s)", n.Name, err, n.path("logs", "init.log"))
	}
	return nil
}

// cgroupHierarchies lists the mounted cgroup v1 hierarchies.
func cgroupHierarchies() []string {
	var out []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			var st unix.Statfs_t
			if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC {
				out = append(out, p)
			}
		}
	}
	return out
}

// bridgeUp makes the host bridge the nodes' veths join. Its MAC address
// is set, not left random: a bridge with a random one takes the lowest of
// its ports', so a node stopped (its veth gone) could change the address
// the other nodes' ARP caches hold for the host, and their connections to
// the API server hung until those entries went stale (45 s of a kubelet
// seeing no pod, in a failover test).
func bridgeUp() error {
	for _, args := range [][]string{
		{"link", "add", nodesBridge, "address", bridgeMAC, "type", "bridge"},
		{"addr", "add", nodesNet + ".1/24", "dev", nodesBridge},
		{"link", "set", nodesBridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
}

// nodeInit is PID 1 of a node: it makes the node's mounts, waits for the
// host to give it its network, starts containerd (and imports the
// images), kubelet and kube-proxy, then reaps orphans until it is told to
// stop. When it exits the kernel kills everything in the node's PID
// namespace, and the node's mounts go with its mount namespace.
func nodeInit(cfg string) error {
	var n node
	if err := json.Unmarshal([]byte(cfg), &n); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(n.Name)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	// Nothing mounted here reaches the host or another node; the
	// host's mounts still reach here.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making / rslave: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	disks := map[string]string{driverData: "disk.img", hddPool: "hdd.img"}
	mounts := map[string]string{driverData: "", hddPool: ""}
	for dst, d := range nodeDirs {
		mounts[dst] = n.path(d)
	}
	for dst, src := range mounts {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if src == "" {
			// The driver's state dir and its hdd pool are the node's
			// own disks.
			if out, err := exec.Command("mount", "-o", "loop", n.path(disks[dst]), dst).CombinedOutput(); err != nil {
				return fmt.Errorf("mounting %s on %s: %v: %s", n.path(disks[dst]), dst, err, out)
			}
		} else if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", src, dst, err)
		}
		// kubelet's and the driver's mounts must propagate between the
		// node's processes (Bidirectional), within the node only.
		if err := unix.Mount("", dst, "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("making %s rshared: %w", dst, err)
		}
	}
	// The host's go-ahead: eth0 is here.
	go_ := os.NewFile(3, "go")
	if _, err := go_.Read(make([]byte, 1)); err != nil {
		return fmt.Errorf("waiting for the network: %w", err)
	}
	go_.Close()
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", n.IP + "/24", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", nodesNet + ".1"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, s := range []string{"net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables", "net/ipv4/conf/all/route_localnet"} {
		os.WriteFile("/proc/sys/"+s, []byte("1"), 0o644) // best effort
	}
	nc := &cluster{bin: n.Bin, state: n.Dir, images: n.Images, node: n.Name, hostIP: net.ParseIP(n.IP),
		log: func(format string, args ...any) { fmt.Printf(format+"\n", args...) }}
	if err := nc.startContainerdWith(n.PodCIDR); err != nil {
		return err
	}
	if err := nc.importImages(); err != nil {
		return err
	}
	if err := nc.startKubeletWith(n.path("pki"), n.path("pki", "kubelet-client.kubeconfig"), n.cgroupRoot()); err != nil {
		return err
	}
	if err := nc.start("kube-proxy", nil, "--kubeconfig="+filepath.Join(filepath.Dir(filepath.Dir(n.Dir)), "kube-proxy.kubeconfig"),
		"--cluster-cidr="+n.PodNet, "--proxy-mode=iptables", "--hostname-override="+n.Name, "--conntrack-max-per-core=0",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256", "--v=1"); err != nil {
		return err
	}
	fmt.Printf("node %s: containerd, kubelet and kube-proxy started\n", n.Name)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, unix.SIGTERM, unix.SIGINT)
	for {
		select {
		case <-stop:
			// kubelet first, so it restarts nothing; then everything
			// dies with this process.
			nc.stop("kubelet")
			fmt.Printf("node %s: stopping\n", n.Name)
			return nil
		case <-time.After(time.Second):
			for {
				pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}

// stopNodes stops every node's init (and so everything in its
// namespaces), then removes what the host side made for them.
func (c *cluster) stopNodes() {
	dirs, _ := filepath.Glob(c.path("nodes", "node-*"))
	for _, d := range dirs {
		stopNode(&node{Name: filepath.Base(d), Dir: d})
	}
	exec.Command("ip", "link", "delete", nodesBridge).Run()
	for k := 1; k <= 9; k++ {
		exec.Command("ip", "route", "delete", fmt.Sprintf("10.88.%d.0/24", k)).Run()
	}
}

// stopNode ends a node's init, and with it every process of the node (the
// kernel kills a PID namespace's processes when its init ends) and its
// mounts; its disk and directories stay.
func stopNode(n *node) {
	if b, err := os.ReadFile(n.path("pids", "init")); err == nil {
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
			terminate(pid, 15*time.Second)
		}
	}
	exec.Command("ip", "link", "delete", "hp-"+n.Name).Run()
	for _, h := range cgroupHierarchies() {
		removeTree(filepath.Join(h, n.cgroupRoot()))
	}
}

// nodeCommand stops or starts one node of a running multi-node cluster
// (NODE names it), as the e2e test's node loss does.
func (c *cluster) nodeCommand(cmd string) error {
	name := os.Getenv("NODE")
	b, err := os.ReadFile(c.path("nodes", name, "node.json"))
	if err != nil {
		return fmt.Errorf("NODE=%q is not a node of the running cluster: %w", name, err)
	}
	var n node
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	if cmd == "node-stop" {
		stopNode(&n)
		c.log("node %s stopped: every process, mount and its veth gone; its disk kept", n.Name)
		return nil
	}
	if err := launchNode(&n); err != nil {
		return err
	}
	c.log("node %s started again on its disk", n.Name)
	return nil
}

// upNodes starts the nodes of a multi-node cluster and waits until every
// one is Ready.
func (c *cluster) upNodes(p *pki, server string, count int) error {
	nodes := c.nodes(count)
	for _, n := range nodes {
		if err := c.startNode(n, p, server); err != nil {
			return err
		}
		c.log("node %s started: %s, pods %s, a %d MiB disk for the driver's state dir and a %d MiB one for its hdd pool", n.Name, n.IP, n.PodCIDR, n.DiskMiB, n.HddMiB)
	}
	a := newAPI(server, p)
	for _, n := range nodes {
		if err := a.waitNodeReady(n.Name, 300*time.Second); err != nil {
			return fmt.Errorf("node %s: %w (logs in %s)", n.Name, err, n.path("logs"))
		}
		c.log("node %s Ready", n.Name)
	}
	c.log("%d nodes Ready; kubectl --kubeconfig %s", count, c.kubeconfig())
	return nil
}

// removeTree removes a cgroup directory and those below it, deepest
// first.
func removeTree(root string) {
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		for i := 0; i < 20 && unix.Rmdir(d) == unix.EBUSY; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
}
