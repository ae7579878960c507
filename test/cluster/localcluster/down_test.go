package localcluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// down stops the cluster and removes everything it made. It is safe to
// run any number of times, also after a failed up; it ends with a check
// and fails if a process, mount, loop device, network namespace, cgroup
// or iptables rule of the cluster is still there.
func (c *cluster) down() error {
	// The nodes of a multi-node cluster: each node's everything goes
	// with its init.
	c.stopNodes()
	// kubelet first, so nothing restarts the containers killed next.
	c.stop("kubelet")
	c.killCgroupProcs()
	c.killByExe("containerd-shim-runc-v2")
	for _, n := range []string{"kube-proxy", "containerd", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		c.stop(n)
	}
	if _, err := os.Stat(filepath.Join(c.bin, "kube-proxy")); err == nil {
		exec.Command(filepath.Join(c.bin, "kube-proxy"), "--cleanup").Run()
	}
	dropRules()
	unmountUnder(kubeletDir, c.state, netnsDir, driverData, poolsDir)
	if ns, _ := filepath.Glob(filepath.Join(netnsDir, "cni-*")); len(ns) > 0 {
		for _, n := range ns {
			os.Remove(n)
		}
	}
	exec.Command("ip", "link", "delete", bridgeDevice).Run()
	// The nodes' disks are loop-mounted with autoclear and go with their
	// mount namespaces; any still bound is let go here. A volume's device
	// still mounted in a node that is going away is only marked to clear
	// when its last opener closes, and one whose last opener closed before
	// the mark stays bound (its image file then holds its node's disk
	// busy too): so again, until none is left or 10 s have passed.
	for try := 0; try < 20; try++ {
		detachLoops(driverData)
		detachLoops(c.path("hdd.img"))
		detachLoops(c.path("nodes"))
		if len(loopsUnder(driverData))+len(loopsUnder(c.path("nodes")))+len(loopsUnder(c.path("hdd.img"))) == 0 {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	removeCgroups()
	if _, err := os.Stat(c.path("root-was-private")); err == nil {
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("making / private again: %w", err)
		}
	}
	for _, d := range []string{c.state, kubeletDir, driverData, poolsDir} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	if left := c.leftovers(); len(left) > 0 {
		return fmt.Errorf("left behind: %s", strings.Join(left, "; "))
	}
	c.log("down: nothing left")
	return nil
}

// stop sends SIGTERM to a daemon started by up, SIGKILL after 10 s.
func (c *cluster) stop(name string) {
	b, err := os.ReadFile(c.path("pids", name))
	if err != nil {
		return
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid > 0 && sameExe(pid, filepath.Join(c.bin, name)) {
		terminate(pid, 10*time.Second)
	}
	os.Remove(c.path("pids", name))
}

// terminate sends pid SIGTERM, and SIGKILL if it is still there after
// grace; it returns once the process is gone (or 5 s after the SIGKILL).
func terminate(pid int, grace time.Duration) {
	if !alive(pid) {
		return
	}
	unix.Kill(pid, unix.SIGTERM)
	for deadline := time.Now().Add(grace); alive(pid) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	if alive(pid) {
		unix.Kill(pid, unix.SIGKILL)
		for i := 0; i < 50 && alive(pid); i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie is gone for our purposes (init reaps it).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func sameExe(pid int, exe string) bool {
	got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && strings.TrimSuffix(got, " (deleted)") == exe
}

// killByExe kills every process whose executable has this base name.
func (c *cluster) killByExe(base string) {
	for _, pid := range pidsWhere(func(pid int) bool {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		return err == nil && filepath.Base(strings.TrimSuffix(exe, " (deleted)")) == base
	}) {
		unix.Kill(pid, unix.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
}

func pidsWhere(keep func(int) bool) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && pid != os.Getpid() && keep(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// cgroupDirs lists the kubepods cgroup trees of every v1 hierarchy, and
// the cgroup roots of the nodes of a multi-node cluster.
func cgroupDirs() []string {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	nodes, _ := filepath.Glob("/sys/fs/cgroup/*/hostpath-node-*")
	return append(roots, nodes...)
}

// killCgroupProcs kills the pods' processes (containers and sandboxes),
// found through their cgroups, until none is left.
func (c *cluster) killCgroupProcs() {
	for round := 0; round < 50; round++ {
		var pids []int
		for _, root := range cgroupDirs() {
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
					return nil
				}
				b, _ := os.ReadFile(p)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						pids = append(pids, pid)
					}
				}
				return nil
			})
		}
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// removeCgroups removes the kubepods trees, deepest first.
func removeCgroups() {
	for _, root := range cgroupDirs() {
		removeTree(root)
	}
}

// mountsUnder lists mount points below any of the prefixes, deepest first.
func mountsUnder(prefixes ...string) []string {
	// mountinfo shows resolved paths (/run/netns, not /var/run/netns).
	for _, p := range prefixes {
		if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
			prefixes = append(prefixes, r)
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescape(fields[4])
		for _, p := range prefixes {
			if mp == p || strings.HasPrefix(mp, p+"/") {
				out = append(out, mp)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out
}

func unescape(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func unmountUnder(prefixes ...string) {
	for round := 0; round < 10; round++ {
		mps := mountsUnder(prefixes...)
		if len(mps) == 0 {
			return
		}
		for _, mp := range mps {
			unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
}

// detachLoops clears the loop devices whose backing file is under dir
// (the driver's block volumes).
func detachLoops(dir string) {
	for _, l := range loopsUnder(dir) {
		if f, err := os.OpenFile(l, os.O_RDONLY, 0); err == nil {
			unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
			f.Close()
		}
	}
}

func loopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, bf := range files {
		b, err := os.ReadFile(bf)
		if err != nil {
			continue
		}
		p := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		// A device the driver attached in its container shows its file
		// relative to the container's mount of the state dir: /volumes/...
		// Kubelet holds a block volume's published device node open with a
		// loop device of its own (backed by the node under volumeDevices,
		// "/" once that is gone), which keeps the driver's device bound: a
		// cluster stopped with such a pod running leaves both.
		if p == dir || strings.HasPrefix(p, dir+"/") || strings.HasPrefix(p, "/volumes/vol-") || strings.HasPrefix(p, "/snapshots/snap-") ||
			strings.Contains(p, "/kubernetes.io/csi/volumeDevices/") || p == "/" {
			out = append(out, "/dev/"+strings.Split(bf, "/")[3])
		}
	}
	return out
}

// dropRules removes the KUBE-* and CNI-* chains, the fence, and every rule
// that uses them, in every table.
func dropRules() {
	out, err := exec.Command("iptables-save").Output()
	if err != nil {
		return
	}
	var keep bytes.Buffer
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "KUBE-") || strings.Contains(l, "CNI-") || strings.Contains(l, fenceChain) {
			continue
		}
		keep.WriteString(l + "\n")
	}
	cmd := exec.Command("iptables-restore")
	cmd.Stdin = &keep
	cmd.Run()
}

// leftovers lists what down failed to remove.
func (c *cluster) leftovers() []string {
	var left []string
	names := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2"}
	for _, pid := range pidsWhere(func(pid int) bool {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		return alive(pid) && bytes.Contains(env, []byte(nodeInitEnv+"="))
	}) {
		left = append(left, fmt.Sprintf("node init %d", pid))
	}
	for _, pid := range pidsWhere(func(pid int) bool {
		for _, n := range names {
			if sameExe(pid, filepath.Join(c.bin, n)) {
				return true
			}
		}
		return false
	}) {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		left = append(left, fmt.Sprintf("process %d (%s)", pid, exe))
	}
	if len(cgroupDirs()) > 0 && !allRemoved(cgroupDirs()) {
		left = append(left, "cgroups "+strings.Join(cgroupDirs(), ", "))
	}
	for _, m := range mountsUnder(kubeletDir, c.state, netnsDir, driverData, poolsDir) {
		left = append(left, "mount "+m)
	}
	for _, l := range append(append(loopsUnder(driverData), loopsUnder(c.path("nodes"))...), loopsUnder(c.path("hdd.img"))...) {
		left = append(left, "loop device "+l)
	}
	if ns, _ := filepath.Glob(filepath.Join(netnsDir, "cni-*")); len(ns) > 0 {
		left = append(left, "network namespaces "+strings.Join(ns, ", "))
	}
	for _, b := range []string{bridgeDevice, nodesBridge} {
		if _, err := os.Stat("/sys/class/net/" + b); err == nil {
			left = append(left, "bridge "+b)
		}
	}
	if veths, _ := filepath.Glob("/sys/class/net/hp-node-*"); len(veths) > 0 {
		left = append(left, "veths "+strings.Join(veths, ", "))
	}
	if out, err := exec.Command("iptables-save").Output(); err == nil && (bytes.Contains(out, []byte("KUBE-")) || bytes.Contains(out, []byte("CNI-")) || bytes.Contains(out, []byte(fenceChain))) {
		left = append(left, "iptables rules of kube-proxy or CNI")
	}
	return left
}

func allRemoved(dirs []string) bool {
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			return false
		}
	}
	return true
}
