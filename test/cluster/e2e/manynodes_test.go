package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The multi-node flow (make e2e NODES=3): the driver on every node of a
// cluster whose nodes are namespaces of their own (test/cluster/localcluster
// nodes_test.go), each with a disk of its own size, driven through
// Kubernetes objects only.

const topologyKey = "topology.hostpath.csi/node"

// nodeRoot is a node's file system as its processes see it.
func nodeRoot(t *testing.T, node string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cacheDir(), "cluster", "nodes", node, "pids", "init"))
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	return fmt.Sprintf("/proc/%s/root", strings.TrimSpace(string(b)))
}

// nodeFree is what the driver's state dir on that node has free.
func nodeFree(t *testing.T, node string) int64 { return nodeFreeAt(t, node, stateDir) }

// nodeFreeAt is what a directory on that node has free.
func nodeFreeAt(t *testing.T, node, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(nodeRoot(t, node)+dir, &st); err != nil {
		t.Fatalf("statfs of %s on node %s: %v", dir, node, err)
	}
	return int64(st.Bavail) * st.Bsize
}

// nodeCapacity is the capacity the CSIStorageCapacity object of the
// hostpath class for node reports, -1 if there is none.
func nodeCapacity(k *kube, node string) int64 { return nodeClassCapacity(k, "hostpath", node) }

// nodeClassCapacity is nodeCapacity for another StorageClass.
func nodeClassCapacity(k *kube, class, node string) int64 {
	for _, c := range k.items("csistoragecapacities", "-A") {
		if c["storageClassName"] != class {
			continue
		}
		top, _ := c["nodeTopology"].(map[string]any)
		labels, _ := top["matchLabels"].(map[string]any)
		if labels[topologyKey] != node {
			continue
		}
		if q, ok := c["capacity"].(string); ok {
			return parseQuantity(q)
		}
		return 0
	}
	return -1
}

// localcluster stops or starts one node of the running cluster.
func localcluster(t *testing.T, cmd, node string) {
	t.Helper()
	c := exec.Command("go", "test", "-count=1", "-run", map[string]string{"node-stop": "^TestNodeStop$", "node-start": "^TestNodeStart$"}[cmd], "./localcluster/")
	c.Dir = ".."
	c.Env = append(os.Environ(), "HOSTPATH_CLUSTER="+cmd, "NODE="+node, "CACHE="+cacheDir())
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cmd, node, err, out)
	}
}

func near(a, b, slack int64) bool { return a-b <= slack && b-a <= slack }

func manyNodes(t *testing.T, k *kube, nodes []string) {
	slices.Sort(nodes)
	k.must("create", "namespace", ns)
	t.Cleanup(func() {
		if t.Failed() {
			fmt.Println(k.events(ns))
			fmt.Println(k.events(driverNS))
		}
	})
	step(t, fmt.Sprintf("CSIStorageCapacity on each of %d nodes is its own disk's free space", len(nodes)), func() {
		for _, n := range nodes {
			k.waitFor("capacity of "+n, 120*time.Second, func() (bool, string) {
				c, free := nodeCapacity(k, n), nodeFree(t, n)
				// The driver subtracts nothing yet; its own files use a
				// little between the two readings.
				return c > 0 && near(c, free, 8<<20), fmt.Sprintf("%d published, %d free", c, free)
			})
		}
		for i := 1; i < len(nodes); i++ {
			if a, b := nodeCapacity(k, nodes[i-1]), nodeCapacity(k, nodes[i]); a >= b {
				t.Fatalf("%s has %d, %s %d: the disks are made larger node by node", nodes[i-1], a, nodes[i], b)
			}
		}
	})
	first := nodes[0]
	step(t, "capacity shrinks on the node that got a volume, only there", func() {
		before := map[string]int64{}
		for _, n := range nodes {
			before[n] = nodeCapacity(k, n)
		}
		k.apply(pvc("pinned", "256Mi", "Filesystem", ""))
		k.apply(onNode(pod("pinned", "pinned", "", "echo pinned > /data/f"), first))
		k.waitPod(ns, "pinned", "Running", 180*time.Second)
		k.waitFor("smaller capacity on "+first, 150*time.Second, func() (bool, string) {
			c := nodeCapacity(k, first)
			return c > 0 && c <= before[first]-200<<20, fmt.Sprintf("%d (was %d)", c, before[first])
		})
		for _, n := range nodes[1:] {
			if c := nodeCapacity(k, n); !near(c, before[n], 8<<20) {
				t.Fatalf("%s's capacity moved from %d to %d", n, before[n], c)
			}
		}
	})
	step(t, "an imported snapshot (a content written with its handle, no label) is ready and restores on its node", func() {
		importedSnapshot(t, k, first)
	})
	largest := nodes[len(nodes)-1]
	step(t, "a PVC that fits only on the largest node lands there", func() {
		// More than any other node has, less than the largest.
		var others int64
		for _, n := range nodes[:len(nodes)-1] {
			others = max(others, nodeCapacity(k, n))
		}
		size := (others + nodeCapacity(k, largest)) / 2
		k.apply(pvc("big", strconv.FormatInt(size>>20, 10)+"Mi", "Filesystem", ""))
		k.apply(pod("big", "big", "", "true"))
		k.waitPod(ns, "big", "Running", 180*time.Second)
		if got := k.jsonpath(ns, "pod/big", "{.spec.nodeName}"); got != largest {
			t.Fatalf("a %d MiB volume's pod runs on %s, want %s (other nodes have at most %d bytes)", size>>20, got, largest, others)
		}
		pv := k.jsonpath(ns, "pvc/big", "{.spec.volumeName}")
		if got := k.jsonpath("", "pv/"+pv, "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"); got != largest {
			t.Fatalf("its PV is bound to node %q, want %s", got, largest)
		}
		k.must("delete", "pod", "big", "-n", ns, "--grace-period=1")
		k.must("delete", "pvc", "big", "-n", ns)
	})
	step(t, "the hdd pool: each node's capacity is its hdd disk's, and a PVC of hostpath-hdd that fits only in the largest lands there", func() {
		hddLargest, hddMax, hddOthers := "", int64(0), int64(0)
		for _, n := range nodes {
			k.waitFor("hdd capacity of "+n, 120*time.Second, func() (bool, string) {
				c, free := nodeClassCapacity(k, "hostpath-hdd", n), nodeFreeAt(t, n, hddPool)
				return c > 0 && near(c, free, 8<<20), fmt.Sprintf("%d published, %d free", c, free)
			})
			if c := nodeClassCapacity(k, "hostpath-hdd", n); c > hddMax {
				hddLargest, hddOthers, hddMax = n, hddMax, c
			} else {
				hddOthers = max(hddOthers, c)
			}
		}
		if hddLargest == largest {
			t.Fatalf("the largest hdd pool is on %s, which also has the largest state dir: the placement below would not tell pools apart", hddLargest)
		}
		size := (hddOthers + hddMax) / 2
		k.apply(inClass(pvc("hddbig", strconv.FormatInt(size>>20, 10)+"Mi", "Filesystem", ""), "hostpath-hdd"))
		k.apply(pod("hddbig", "hddbig", "", "echo hdd > /data/where && sync"))
		k.waitPod(ns, "hddbig", "Running", 180*time.Second)
		if got := k.jsonpath(ns, "pod/hddbig", "{.spec.nodeName}"); got != hddLargest {
			t.Fatalf("a %d MiB hdd volume's pod runs on %s, want %s (the other hdd pools have at most %d bytes)", size>>20, got, hddLargest, hddOthers)
		}
		handle := volumeHandle(k, "hddbig")
		// An image volume (the class names no layout): its image is in
		// that node's hdd pool, and the pod's file in it.
		if _, err := os.Stat(filepath.Join(nodeRoot(t, hddLargest), hddPool, "volumes", handle+".img")); err != nil {
			t.Fatalf("the volume is not in %s's hdd pool: %v", hddLargest, err)
		}
		waitPodFile(k, "hddbig", "/data/where", "hdd", 60*time.Second)
		fmt.Printf("e2e      a %d MiB hostpath-hdd volume placed on %s, the only hdd pool with room (state dirs: %s is largest)\n", size>>20, hddLargest, largest)
		k.must("delete", "pod", "hddbig", "-n", ns, "--grace-period=1")
		k.must("delete", "pvc", "hddbig", "-n", ns)
	})
	standbyCopies(t, k, nodes)
	standbyPostgres(t, k)
	step(t, "a PVC that fits nowhere stays Pending, and the event says why", func() {
		k.apply(pvc("huge", "64Gi", "Filesystem", ""))
		k.apply(pod("huge", "huge", "", "true"))
		k.waitFor("FailedScheduling about storage", 90*time.Second, func() (bool, string) {
			ev := k.must("get", "events", "-n", ns, "--field-selector", "involvedObject.name=huge,reason=FailedScheduling", "-o", "jsonpath={.items[*].message}")
			return strings.Contains(ev, "storage"), ev
		})
		if p := k.jsonpath(ns, "pod/huge", "{.status.phase}"); p != "Pending" {
			t.Fatalf("the pod of a volume that fits nowhere is %s", p)
		}
		k.must("delete", "pod", "huge", "-n", ns, "--grace-period=0", "--force")
		k.must("delete", "pvc", "huge", "-n", ns)
	})
	placed := map[string]string{} // replica -> node
	step(t, "StatefulSet replicas with anti-affinity each get a volume on their own node", func() {
		k.apply(statefulSet(len(nodes)))
		for i := range nodes {
			name := fmt.Sprintf("web-%d", i)
			k.waitPod(ns, name, "Running", 240*time.Second)
			node := k.jsonpath(ns, "pod/"+name, "{.spec.nodeName}")
			pv := k.jsonpath(ns, "pvc/data-"+name, "{.spec.volumeName}")
			if got := k.jsonpath("", "pv/"+pv, "{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}"); got != node {
				t.Fatalf("%s runs on %s and its PV is bound to %q", name, node, got)
			}
			placed[name] = node
		}
		seen := map[string]bool{}
		for _, n := range placed {
			if seen[n] {
				t.Fatalf("two replicas on one node: %v", placed)
			}
			seen[n] = true
		}
	})
	crossNode(t, k, first, placed["web-0"])
	groupSnapshots(t, k, nodes)
	bigPull(t, k, largest, nodes[1])
	lost := placed["web-1"]
	step(t, "node "+lost+" lost: its CSINode and capacity go, its PV stays, its pod waits for it", func() {
		pv := k.jsonpath(ns, "pvc/data-web-1", "{.spec.volumeName}")
		localcluster(t, "node-stop", lost)
		k.must("delete", "node", lost, "--wait=true", "--timeout=120s")
		k.waitFor("CSINode and CSIStorageCapacity of "+lost+" gone", 180*time.Second, func() (bool, string) {
			_, err := k.run("", "get", "csinode", lost)
			c := nodeCapacity(k, lost)
			return err != nil && c < 0, fmt.Sprintf("csinode err %v, capacity %d", err, c)
		})
		if got := k.jsonpath("", "pv/"+pv, "{.status.phase}"); got != "Bound" {
			t.Fatalf("the lost node's PV is %q", got)
		}
		var told string
		k.waitFor("web-1 back, Pending, and told which node it waits for", 180*time.Second, func() (bool, string) {
			p := k.jsonpath(ns, "pod/web-1", "{.status.phase}")
			ev, _ := k.run("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=web-1,reason=FailedScheduling", "-o", "jsonpath={.items[*].message}")
			// The scheduler's words ("didn't match PersistentVolume's node
			// affinity") do not name the node; the driver's event does.
			told, _ = k.run("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=web-1,reason=VolumeNodeGone", "-o", "jsonpath={.items[*].message}")
			ok := p == "Pending" && strings.Contains(ev, "node affinity") && strings.Contains(told, "waits for node "+lost+",")
			return ok, p + " | " + ev + " | " + told
		})
		claim, _ := k.run("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=data-web-1,reason=VolumeNodeGone", "-o", "jsonpath={.items[*].message}")
		if !strings.Contains(claim, "on node "+lost+",") {
			t.Fatalf("data-web-1 has no event naming %s: %q", lost, claim)
		}
		fmt.Printf("e2e      web-1 waits for its volume on %s (PV %s); its event: %s\n", lost, pv, told)
	})
	step(t, "node "+lost+" back on its disk: its volume is served again with its data", func() {
		localcluster(t, "node-start", lost)
		k.waitFor("CSINode of "+lost, 240*time.Second, func() (bool, string) {
			d, _ := k.run("", "get", "csinode", lost, "-o", "jsonpath={.spec.drivers[*].name}")
			return strings.Contains(d, "hostpath.csi.k8s.io"), d
		})
		k.waitPod(ns, "web-1", "Running", 240*time.Second)
		if got := strings.TrimSpace(k.exec(ns, "web-1", "cat", "/data/who")); got != lost {
			t.Fatalf("web-1's volume reads %q, want what it wrote on %s", got, lost)
		}
	})
	// The previous release refuses a state dir holding image volumes (it
	// predates them: the downgrade guard), so the upgrade starts from
	// clean nodes, as a cluster on that release would be.
	cleanNodes(t, k, nodes, "everything deleted: nothing left on any node")
	k.must("create", "namespace", ns)
	rollingUpgrade(t, k, nodes)
	cleanNodes(t, k, nodes, "the upgrade's volumes deleted: nothing left on any node")
}

// cleanNodes deletes the test's namespace and waits until no PV, mount,
// loop device, volume or snapshot is left on any node.
func cleanNodes(t *testing.T, k *kube, nodes []string, name string) {
	step(t, name, func() {
		if _, err := k.run("", "delete", "namespace", ns, "--timeout=300s"); err != nil {
			t.Fatalf("%v\n%s", err, k.leftIn(ns))
		}
		waitNodesClean(t, k, nodes)
	})
}

// waitNodesClean waits until no PV is left, and no mount, loop device,
// volume or snapshot of the driver on any node.
func waitNodesClean(t *testing.T, k *kube, nodes []string) {
	t.Helper()
	k.waitFor("PVs deleted", 180*time.Second, func() (bool, string) {
		pvs := k.items("pv")
		return len(pvs) == 0, fmt.Sprintf("%d PVs", len(pvs))
	})
	k.waitFor("nodes clean", 60*time.Second, func() (bool, string) {
		var left []string
		for _, n := range nodes {
			root := nodeRoot(t, n)
			for _, l := range leftoversIn(root, filepath.Join(filepath.Dir(root), "mountinfo")) {
				left = append(left, n+": "+l)
			}
		}
		return len(left) == 0, strings.Join(left, "; ")
	})
}

// layoutOn is the layout of a claim's volume as its node's disk holds it:
// "image" (an image file) or "directory".
func layoutOn(t *testing.T, k *kube, node, claim string) string {
	t.Helper()
	handle := volumeHandle(k, claim)
	for _, pool := range []string{stateDir, hddPool} {
		vols := filepath.Join(nodeRoot(t, node), pool, "volumes")
		if _, err := os.Stat(filepath.Join(vols, handle+".img")); err == nil {
			return "image"
		}
		if st, err := os.Stat(filepath.Join(vols, handle)); err == nil && st.IsDir() {
			return "directory"
		}
	}
	t.Fatalf("volume %s of %s is on no pool of %s", handle, claim, node)
	return ""
}

// crossNode restores a snapshot, clones a volume and restores a block
// snapshot into pods kept off the node that holds the source (node), and
// restores a replica of another StatefulSet from a snapshot of web-0 (on
// web0Node) away from it: each volume is built on its pod's node from the
// source pulled from the other node, with the same bytes.
func crossNode(t *testing.T, k *kube, node, web0Node string) {
	var fileSum, blockSum, imageSum string
	step(t, "sources on "+node+": a file in pinned, a block volume, an image volume, their snapshots", func() {
		fileSum = strings.Fields(k.exec(ns, "pinned", "sh", "-c", "head -c 8388608 /dev/urandom > /data/random && sync && sha256sum /data/random"))[0]
		takeSnapshot(k, "xsnap", "pinned")
		k.apply(pvc("xblk", "32Mi", "Block", ""))
		k.apply(onNode(pod("xblk", "xblk", "block", "head -c 4194304 /dev/urandom > /tmp/r && dd if=/tmp/r of=/dev/xvda bs=1M conv=fsync 2>/dev/null && sha256sum /tmp/r > /tmp/sum"), node))
		k.waitPod(ns, "xblk", "Running", 180*time.Second)
		k.waitFor("xblk written", 60*time.Second, func() (bool, string) {
			out, err := k.run("", "exec", "-n", ns, "xblk", "--", "cat", "/tmp/sum")
			if err != nil || len(strings.Fields(out)) == 0 {
				return false, out
			}
			blockSum = strings.Fields(out)[0]
			return true, ""
		})
		takeSnapshot(k, "xblksnap", "xblk")
		k.apply(inClass(pvc("ximg", "64Mi", "Filesystem", ""), "hostpath-image"))
		k.apply(onNode(pod("ximg", "ximg", "", "head -c 8388608 /dev/urandom > /data/random && sync"), node))
		k.waitPod(ns, "ximg", "Running", 180*time.Second)
		imageSum = strings.Fields(k.exec(ns, "ximg", "sha256sum", "/data/random"))[0]
		takeSnapshot(k, "ximgsnap", "ximg")
	})
	snapContent := k.jsonpath(ns, "volumesnapshot/xsnap", "{.status.boundVolumeSnapshotContentName}")
	peerAttempts(t, k, node, snapContent, k.jsonpath("", "volumesnapshotcontent/"+snapContent, "{.status.snapshotHandle}"), volumeHandle(k, "pinned"))
	controllerAttempts(t, k, k.jsonpath(ns, "pvc/pinned", "{.spec.volumeName}"))
	rollOver(t, k)
	cases := []struct{ name, class, size, mode, source, read, want string }{
		{"x-restore", "hostpath", "256Mi", "Filesystem", "{kind: VolumeSnapshot, name: xsnap, apiGroup: snapshot.storage.k8s.io}", "sha256sum /data/random", fileSum},
		{"x-clone", "hostpath", "256Mi", "Filesystem", "{kind: PersistentVolumeClaim, name: pinned}", "sha256sum /data/random", fileSum},
		{"x-blk-restore", "hostpath", "256Mi", "Block", "{kind: VolumeSnapshot, name: xblksnap, apiGroup: snapshot.storage.k8s.io}", "head -c 4194304 /dev/xvda | sha256sum", blockSum},
		// An image volume's snapshot, and the image volume itself in
		// use (a copy cut frozen on its node), pulled to another node;
		// at its size (growing its file system at stage needs
		// CAP_SYS_RESOURCE, which this runner's containers lack).
		{"x-img-restore", "hostpath-image", "64Mi", "Filesystem", "{kind: VolumeSnapshot, name: ximgsnap, apiGroup: snapshot.storage.k8s.io}", "sha256sum /data/random", imageSum},
		{"x-img-clone", "hostpath-image", "64Mi", "Filesystem", "{kind: PersistentVolumeClaim, name: ximg}", "sha256sum /data/random", imageSum},
	}
	step(t, "restored, cloned and block-restored on nodes other than "+node+": the same bytes", func() {
		for _, c := range cases {
			block := ""
			if c.mode == "Block" {
				block = "block"
			}
			k.apply(inClass(pvc(c.name, c.size, c.mode, c.source), c.class))
			k.apply(awayFrom(pod(c.name, c.name, block, "true"), node))
		}
		for _, c := range cases {
			k.waitPod(ns, c.name, "Running", 240*time.Second)
			on := k.jsonpath(ns, "pod/"+c.name, "{.spec.nodeName}")
			if on == node {
				t.Fatalf("%s runs on %s, the source's node", c.name, on)
			}
			if got := strings.Fields(k.exec(ns, c.name, "sh", "-c", c.read))[0]; got != c.want {
				t.Fatalf("%s on %s reads sha256 %s, the source %s", c.name, on, got, c.want)
			}
			fmt.Printf("e2e      %s built on %s from %s's source\n", c.name, on, node)
		}
		for _, c := range cases {
			k.must("delete", "pod", c.name, "-n", ns, "--grace-period=1")
			k.must("delete", "pvc", c.name, "-n", ns)
		}
		k.must("delete", "pod", "xblk", "ximg", "-n", ns, "--grace-period=1")
		k.must("delete", "volumesnapshot", "xsnap", "xblksnap", "ximgsnap", "-n", ns)
		k.must("delete", "pvc", "xblk", "ximg", "-n", ns)
	})
	step(t, "a replica restored from a snapshot of web-0 (on "+web0Node+") on another node", func() {
		takeSnapshot(k, "web0snap", "data-web-0")
		k.apply(fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: replica, namespace: %s}
spec:
  serviceName: replica
  replicas: 1
  selector: {matchLabels: {app: replica}}
  template:
    metadata: {labels: {app: replica}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {statefulset.kubernetes.io/pod-name: web-0}}
            topologyKey: kubernetes.io/hostname
      containers:
      - name: c
        image: %s
        imagePullPolicy: Never
        command: ["sh", "-c", "sleep 3600"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      storageClassName: hostpath
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 16Mi}}
      dataSource: {kind: VolumeSnapshot, name: web0snap, apiGroup: snapshot.storage.k8s.io}
`, ns, busybox))
		k.waitPod(ns, "replica-0", "Running", 240*time.Second)
		on := k.jsonpath(ns, "pod/replica-0", "{.spec.nodeName}")
		if got := strings.TrimSpace(k.exec(ns, "replica-0", "cat", "/data/who")); on == web0Node || got != web0Node {
			t.Fatalf("replica-0 on %s reads %q, want web-0's %q from another node", on, got, web0Node)
		}
		fmt.Printf("e2e      replica-0 on %s restored from web-0's snapshot on %s\n", on, web0Node)
		k.must("delete", "statefulset", "replica", "-n", ns)
		k.must("delete", "pvc", "data-replica-0", "-n", ns, "--wait=false")
		k.must("delete", "volumesnapshot", "web0snap", "-n", ns)
	})
}

// bigPull clones a volume of several GiB, written by a pod on node from,
// into a pod kept on node to: the pull takes longer than the
// provisioner's --timeout (10 s, its default; deploy/ leaves it), whose
// calls are answered that the volume is being pulled while the pull goes
// on, and the claim is bound once it is done, with the same bytes.
func bigPull(t *testing.T, k *kube, from, to string) {
	const size = 5 << 29 // 2.5 GiB
	step(t, fmt.Sprintf("a %.1f GiB clone pulled from %s to %s outlives the provisioner's timeout", float64(size)/(1<<30), from, to), func() {
		var want string
		k.apply(pvc("big", "2816Mi", "Filesystem", ""))
		k.apply(onNode(pod("big", "big", "", fmt.Sprintf("head -c %d /dev/urandom > /data/big && sync && sha256sum /data/big > /data/sum", size)), from))
		k.waitPod(ns, "big", "Running", 180*time.Second)
		k.waitFor("the big file written", 10*time.Minute, func() (bool, string) {
			out, err := k.run("", "exec", "-n", ns, "big", "--", "cat", "/data/sum")
			if err != nil || len(strings.Fields(out)) == 0 {
				return false, out
			}
			want = strings.Fields(out)[0]
			return true, ""
		})
		start := time.Now()
		k.apply(pvc("big-clone", "2816Mi", "Filesystem", "{kind: PersistentVolumeClaim, name: big}"))
		k.apply(onNode(pod("big-clone", "big-clone", "", "true"), to))
		k.waitPod(ns, "big-clone", "Running", 15*time.Minute)
		took := time.Since(start)
		if on := k.jsonpath(ns, "pod/big-clone", "{.spec.nodeName}"); on != to {
			t.Fatalf("big-clone runs on %s, want %s", on, to)
		}
		if ev := k.describe(ns, "pvc/big-clone"); !strings.Contains(ev, "being pulled") {
			t.Fatalf("the provisioner was never told the volume is being pulled (the pull took %v): is it shorter than the provisioner's timeout?\n%s", took, ev)
		}
		if got := strings.Fields(k.exec(ns, "big-clone", "sha256sum", "/data/big"))[0]; got != want {
			t.Fatalf("big-clone reads sha256 %s, the source %s", got, want)
		}
		fmt.Printf("e2e      %.1f GiB cloned from %s to %s in %v, across provisioner timeouts, the same bytes\n", float64(size)/(1<<30), from, to, took.Round(time.Second))
		k.must("delete", "pod", "big", "big-clone", "-n", ns, "--grace-period=1")
		k.must("delete", "pvc", "big", "big-clone", "-n", ns)
	})
}

// awayFrom keeps a pod off one node.
func awayFrom(manifest, node string) string {
	return strings.Replace(manifest, "spec:\n", "spec:\n  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: NotIn, values: ["+node+"]}]}]}}}\n", 1)
}

// onNode keeps a pod to one node through the scheduler (nodeName would
// skip it, and with it the binding of a WaitForFirstConsumer claim).
func onNode(manifest, node string) string {
	return strings.Replace(manifest, "spec:\n", "spec:\n  nodeSelector: {kubernetes.io/hostname: "+node+"}\n", 1)
}

// statefulSet has one replica per node, kept apart by pod anti-affinity,
// each writing its node's name into its volume.
func statefulSet(replicas int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web, namespace: %s}
spec:
  serviceName: web
  replicas: %d
  podManagementPolicy: Parallel
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 1
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - labelSelector: {matchLabels: {app: web}}
            topologyKey: kubernetes.io/hostname
      containers:
      - name: c
        image: %s
        imagePullPolicy: Never
        env: [{name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
        command: ["sh", "-c", "test -f /data/who || echo $NODE > /data/who; sync; sleep 3600"]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      storageClassName: hostpath
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 16Mi}}
`, ns, replicas, busybox)
}

// leftoversIn lists what the driver left on the node whose file system is
// at root and whose mounts mountinfo lists: CSI mounts of pods, volume and
// snapshot data, or standby copies and cuts; and loop devices of block
// volumes anywhere.
func leftoversIn(root, mountinfo string) []string {
	var left []string
	if f, err := os.Open(mountinfo); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			fs := strings.Fields(s.Text())
			if len(fs) > 4 && (strings.Contains(fs[4], "kubernetes.io~csi") || strings.HasPrefix(fs[4], stateDir+"/")) {
				left = append(left, "mount "+fs[4])
			}
		}
		f.Close()
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range files {
		// Attached in the driver's container, a device shows its file
		// relative to that container's mount of the state dir.
		if b, _ := os.ReadFile(bf); strings.HasPrefix(string(b), stateDir) || strings.HasPrefix(string(b), hddPool) || strings.HasPrefix(string(b), "/volumes/vol-") {
			left = append(left, "loop device for "+strings.TrimSpace(string(b)))
		}
	}
	for _, dir := range []string{stateDir, hddPool} {
		for _, d := range []string{"volumes", "snapshots", "standby"} {
			entries, _ := os.ReadDir(filepath.Join(root, dir, d))
			for _, e := range entries {
				if e.Name() == ".hostpath-volumes" { // the driver's marker stays
					continue
				}
				left = append(left, filepath.Join(dir, d, e.Name()))
			}
		}
	}
	return left
}

// runsImage waits until every driver pod runs ref.
func runsImage(t *testing.T, k *kube, ref string) {
	t.Helper()
	k.waitFor("every driver pod on "+ref, 60*time.Second, func() (bool, string) {
		images := strings.Fields(k.jsonpath(driverNS, "pods", "{.items[*].spec.containers[0].image}"))
		for _, i := range images {
			if i != ref {
				return false, strings.Join(images, " ")
			}
		}
		return len(images) > 0, ""
	})
}

// writerScript writes a random file once, then appends a counter with a
// sync every 200 ms; a failed write ends the container (and so counts as
// a restart).
const writerScript = `test -f /data/static || { head -c 1048576 /dev/urandom > /data/static; sync; }; ` +
	`i=$(wc -l < /data/log 2>/dev/null || echo 0); while echo $i >> /data/log && sync; do i=$((i+1)); sleep 0.2; done; echo WRITE FAILED; exit 1`

// rollingUpgrade moves the DaemonSet from the previous release's image
// (make image-previous) to the one built here while a pod on every node
// writes to its volume, and checks that no write failed and that every
// volume, snapshot and publication the previous driver made is served by
// the new one with the same bytes.
func rollingUpgrade(t *testing.T, k *kube, nodes []string) {
	prev, _ := filepath.Glob(filepath.Join(cacheDir(), "images", "hostpathplugin-previous-*.tar"))
	if len(prev) != 1 {
		t.Fatalf("the previous release's image: %v (make image-previous builds it)", prev)
	}
	prevRef := imageRef(t, prev[0])
	curRef := imageRef(t, filepath.Join(cacheDir(), "images", "hostpathplugin.tar"))
	// The previous release is deployed with its own manifests (its flags),
	// and upgraded by applying this one's, as a user does.
	prevDeploy := filepath.Join(cacheDir(), "images", "previous-deploy-"+strings.TrimSuffix(strings.TrimPrefix(filepath.Base(prev[0]), "hostpathplugin-previous-"), ".tar"))
	if _, err := os.Stat(prevDeploy); err != nil {
		t.Fatalf("the previous release's deploy/: %v (make image-previous exports it)", err)
	}
	sums := map[string]string{}
	var watchesBefore, requestsBefore map[string]int
	step(t, "previous release ("+prevRef[strings.LastIndex(prevRef, ":")+1:]+") deployed with its own manifests on every node, a writer on each", func() {
		// A cluster on the previous release has no transfer signer: its
		// nodes keep the authority, key and all, in the shared Secret.
		k.must("delete", "deployment,serviceaccount,role,rolebinding", "hostpath-csi-transfer-signer", "-n", driverNS, "--ignore-not-found", "--wait=true")
		// Its pod goes after its Deployment: until then it would make
		// its Secret again.
		k.must("wait", "--for=delete", "pod", "-l", "app=hostpath-csi-transfer-signer", "-n", driverNS, "--timeout=120s")
		k.must("delete", "clusterrole,clusterrolebinding", "hostpath-csi-transfer-signer", "--ignore-not-found")
		k.must("delete", "secret/"+signerSecret, "configmap/"+trustConfigMap, "-n", driverNS, "--ignore-not-found")
		// Nor a controller: its nodes' snapshotters need the
		// snapshot-controller's distributed snapshotting, as its README
		// asked.
		k.must("delete", "deployment,serviceaccount,role,rolebinding", "hostpath-csi-controller", "-n", driverNS, "--ignore-not-found", "--wait=true")
		k.must("wait", "--for=delete", "pod", "-l", "app=hostpath-csi-controller", "-n", driverNS, "--timeout=120s")
		snapshotController(t, k, true)
		deployFrom(t, k, prevDeploy, prevRef)
		runsImage(t, k, prevRef)
		for i, n := range nodes {
			name := fmt.Sprintf("up-%d", i)
			k.apply(pvc(name, "32Mi", "Filesystem", ""))
			k.apply(onNode(pod(name, name, "", writerScript), n))
		}
		for i := range nodes {
			name := fmt.Sprintf("up-%d", i)
			k.waitPod(ns, name, "Running", 180*time.Second)
			k.waitFor("static file of "+name, 60*time.Second, func() (bool, string) {
				out, err := k.run("", "exec", "-n", ns, name, "--", "sha256sum", "/data/static")
				if err != nil || len(strings.Fields(out)) == 0 {
					return false, out
				}
				sums[name] = strings.Fields(out)[0]
				return true, ""
			})
		}
		takeSnapshot(k, "up-snap", "up-0")
		time.Sleep(5 * time.Second) // the sidecars' informers settled
		watchesBefore = watches(t, k)
		requestsBefore = requests(t, k, requestWindow)
	})
	lines := map[string]int{}
	step(t, "DaemonSet rolled to the current image while the pods write", func() {
		for i := range nodes {
			name := fmt.Sprintf("up-%d", i)
			lines[name] = logLines(t, k, name)
		}
		deployImage(t, k, curRef)
		runsImage(t, k, curRef)
		time.Sleep(3 * time.Second)
		for i := range nodes {
			name := fmt.Sprintf("up-%d", i)
			if r := k.jsonpath(ns, "pod/"+name, "{.status.containerStatuses[0].restartCount}"); r != "0" {
				t.Fatalf("%s's writer restarted %s times: a write failed during the upgrade\n%s", name, r, k.must("logs", "-n", ns, name, "--previous"))
			}
			if n := logLines(t, k, name); n <= lines[name] {
				t.Fatalf("%s stopped writing: %d lines before the upgrade, %d after", name, lines[name], n)
			}
			// Every line written, in order: no write lost or doubled.
			if out, err := k.run("", "exec", "-n", ns, name, "--", "awk", "NR-1 != $1 {print NR; exit 1}", "/data/log"); err != nil {
				t.Fatalf("%s's log is not the lines it wrote (at line %s): %v", name, out, err)
			}
		}
	})
	step(t, "watches on the API server: one snapshotter and one resizer for the cluster, not one per node", func() {
		after := watches(t, k)
		var report []string
		for _, r := range []string{"persistentvolumeclaims", "persistentvolumes", "volumesnapshotcontents", "volumesnapshotclasses", "volumegroupsnapshotcontents"} {
			report = append(report, fmt.Sprintf("%s %d -> %d", r, watchesBefore[r], after[r]))
		}
		fmt.Printf("e2e      watches held by the API server, previous release (node snapshotters and resizers) -> this one: %s\n", strings.Join(report, ", "))
		reqs := requests(t, k, requestWindow)
		report = nil
		for _, r := range []string{"total", "leases", "persistentvolumeclaims", "persistentvolumes", "volumesnapshotcontents", "volumesnapshots", "volumeattachments", "csinodes"} {
			report = append(report, fmt.Sprintf("%s %d -> %d", r, requestsBefore[r], reqs[r]))
		}
		fmt.Printf("e2e      API requests in %v of an idle cluster, previous release -> this one: %s\n", requestWindow, strings.Join(report, ", "))
		if after["volumesnapshotcontents"] >= watchesBefore["volumesnapshotcontents"] {
			t.Fatalf("the API server holds %d watches of snapshot contents after the upgrade, %d before: the nodes still watch them", after["volumesnapshotcontents"], watchesBefore["volumesnapshotcontents"])
		}
	})
	step(t, "after the upgrade, with distributed snapshotting still on: a snapshot through the controller", func() {
		// The contents the snapshot-controller labels with a node are
		// the controller's snapshotter's too: it is not a node's.
		takeSnapshot(k, "up-snap-after", "up-1")
		if l := k.jsonpath("", "volumesnapshotcontent/"+k.jsonpath(ns, "volumesnapshot/up-snap-after", "{.status.boundVolumeSnapshotContentName}"), "{.metadata.labels}"); !strings.Contains(l, "managed-by") {
			t.Logf("the content carries no managed-by label (%s): distributed snapshotting did not label it", l)
		}
	})
	step(t, "the previous release's volumes, snapshot and publications served by the current one", func() {
		for i, n := range nodes {
			name := fmt.Sprintf("up-%d", i)
			// A second publication of the same volume, by the new driver.
			k.apply(onNode(pod(name+"-again", name, "", "true"), n))
			k.waitPod(ns, name+"-again", "Running", 180*time.Second)
			if got := strings.Fields(k.exec(ns, name+"-again", "sha256sum", "/data/static"))[0]; got != sums[name] {
				t.Fatalf("%s reads %s after the upgrade, %s before", name, got, sums[name])
			}
		}
		// The restore runs where the snapshot is.
		k.apply(pvc("up-restored", "32Mi", "Filesystem", "{kind: VolumeSnapshot, name: up-snap, apiGroup: snapshot.storage.k8s.io}"))
		k.apply(onNode(pod("up-restored", "up-restored", "", "true"), nodes[0]))
		k.waitPod(ns, "up-restored", "Running", 180*time.Second)
		if got := strings.Fields(k.exec(ns, "up-restored", "sha256sum", "/data/static"))[0]; got != sums["up-0"] {
			t.Fatalf("the previous release's snapshot restores to %s, want %s", got, sums["up-0"])
		}
	})
	// The previous release has no node-to-node transfer: the signer makes
	// its own authority (it adopts none: no release had the shared Secret
	// of the development builds, and that mode is gone), and a restore
	// across nodes works right after the upgrade.
	step(t, "after the upgrade the transfer signer's certificates serve a restore of the previous release's snapshot on another node", func() {
		if a := k.jsonpath(driverNS, "secret/"+signerSecret, `{.data.adopted\.crt}`); a != "" {
			t.Fatal("the signer adopted an authority, but the previous release kept none")
		}
		k.apply(pvc("up-restored-x", "32Mi", "Filesystem", "{kind: VolumeSnapshot, name: up-snap, apiGroup: snapshot.storage.k8s.io}"))
		k.apply(onNode(pod("up-restored-x", "up-restored-x", "", "true"), nodes[1]))
		k.waitPod(ns, "up-restored-x", "Running", 240*time.Second)
		if got := strings.Fields(k.exec(ns, "up-restored-x", "sha256sum", "/data/static"))[0]; got != sums["up-0"] {
			t.Fatalf("the previous release's snapshot restored on %s reads %s, want %s", nodes[1], got, sums["up-0"])
		}
		fmt.Printf("e2e      the previous release's snapshot on %s restored on %s after the upgrade\n", nodes[0], nodes[1])
	})
	step(t, "after the upgrade: the previous release's volumes stay directories, new ones in the same class are image volumes", func() {
		// The class names no layout: the previous release made directory
		// volumes there, this deploy/'s --default-layout makes image
		// volumes, and a restore takes its source's layout.
		for i, n := range nodes {
			if got := layoutOn(t, k, n, fmt.Sprintf("up-%d", i)); got != "directory" {
				t.Fatalf("up-%d, made by the previous release, is a %s volume after the upgrade", i, got)
			}
		}
		if got := layoutOn(t, k, nodes[0], "up-restored"); got != "directory" {
			t.Fatalf("up-restored, from a directory volume's snapshot in a class naming no layout, is a %s volume", got)
		}
		k.apply(pvc("up-new", "32Mi", "Filesystem", ""))
		k.apply(onNode(pod("up-new", "up-new", "", "echo new > /data/f"), nodes[0]))
		k.waitPod(ns, "up-new", "Running", 180*time.Second)
		if got := layoutOn(t, k, nodes[0], "up-new"); got != "image" {
			t.Fatalf("a new volume of the class after the upgrade is a %s volume, want image", got)
		}
	})
}

func logLines(t *testing.T, k *kube, pod string) int {
	t.Helper()
	out := k.exec(ns, pod, "sh", "-c", "wc -l < /data/log")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("lines of %s's log: %q", pod, out)
	}
	return n
}

// importedSnapshot takes a snapshot of the PVC "pinned" (on node), then
// imports it again as a user does: a VolumeSnapshotContent with its
// snapshotHandle and no managed-by label, and a VolumeSnapshot naming it.
// The controller's snapshotter makes it ready (no node labels it), and a
// PVC restored from it on that node has the same bytes. (The
// scheduler does not know where a snapshot is: the restore's pod is kept
// to the node, as a restore from another node is not served yet.)
func importedSnapshot(t *testing.T, k *kube, node string) {
	takeSnapshot(k, "orig", "pinned")
	content := k.jsonpath(ns, "volumesnapshot/orig", "{.status.boundVolumeSnapshotContentName}")
	handle := k.jsonpath("", "volumesnapshotcontent/"+content, "{.status.snapshotHandle}")
	k.apply(fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: imported-%s}
spec:
  deletionPolicy: Retain
  driver: hostpath.csi.k8s.io
  volumeSnapshotClassName: hostpath
  source: {snapshotHandle: %s}
  volumeSnapshotRef: {name: imported, namespace: %s}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: imported, namespace: %s}
spec:
  source: {volumeSnapshotContentName: imported-%s}
`, ns, handle, ns, ns, ns))
	t.Cleanup(func() { k.run("", "delete", "volumesnapshotcontent", "imported-"+ns, "--ignore-not-found") })
	waitSnapshot(k, "imported")
	// No label: the controller's snapshotter takes every content of the
	// driver, and no node watches them.
	if got := k.jsonpath("", "volumesnapshotcontent/imported-"+ns, `{.metadata.labels.snapshot\.storage\.kubernetes\.io/managed-by}`); got != "" {
		t.Fatalf("the imported content is labelled for %q: no node labels contents any more", got)
	}
	k.apply(pvc("from-imported", "256Mi", "Filesystem", "{kind: VolumeSnapshot, name: imported, apiGroup: snapshot.storage.k8s.io}"))
	k.apply(onNode(pod("from-imported", "from-imported", "", "true"), node))
	k.waitPod(ns, "from-imported", "Running", 180*time.Second)
	if got := strings.TrimSpace(k.exec(ns, "from-imported", "cat", "/data/f")); got != "pinned" {
		t.Fatalf("restored from the imported snapshot: %q", got)
	}
	k.must("delete", "pod", "from-imported", "-n", ns, "--grace-period=1")
	k.must("delete", "pvc", "from-imported", "-n", ns)
	k.must("delete", "volumesnapshot", "imported", "-n", ns)
	k.must("delete", "volumesnapshotcontent", "imported-"+ns)
}

// withLabels puts labels on a manifest made by pvc or pod.
func withLabels(manifest, labels string) string {
	return strings.Replace(manifest, "namespace: "+ns+"}", "namespace: "+ns+", labels: {"+labels+"}}", 1)
}

// groupSnapshot asks for a VolumeGroupSnapshot of the claims labelled
// group=name, in deploy/'s VolumeGroupSnapshotClass.
func groupSnapshot(k *kube, name string) {
	k.apply(fmt.Sprintf(`apiVersion: groupsnapshot.storage.k8s.io/v1
kind: VolumeGroupSnapshot
metadata: {name: %s, namespace: %s}
spec:
  volumeGroupSnapshotClassName: hostpath
  source: {selector: {matchLabels: {group: %s}}}
`, name, ns, name))
}

// groupSnapshots: a VolumeGroupSnapshot through Kubernetes, with
// upstream's snapshot-controller as shipped, of PostgreSQL's data
// directory and its pg_wal on two claims on one node while pgbench
// writes; both members restored on another node, where PostgreSQL starts
// (crash recovery across the two copies, which only one instant makes
// consistent), pgbench's invariant holds and pg_amcheck is clean. And one
// of claims on two nodes refused, its error naming both.
func groupSnapshots(t *testing.T, k *kube, nodes []string) {
	on, to := nodes[0], nodes[1]
	step(t, "PostgreSQL's data and pg_wal on two claims on "+on+": a VolumeGroupSnapshot while pgbench writes, restored on "+to+", starts with pgbench's invariant and pg_amcheck clean", func() {
		for _, c := range []string{"g1-data", "g1-wal"} {
			k.apply(withLabels(pvc(c, "128Mi", "Filesystem", ""), "group: g1"))
		}
		k.apply(onNode(pgPodWAL("g1", "g1-data", "g1-wal", `[ -d /data/pg ] || initdb -D /data/pg --waldir=/wal/wal -U postgres --auth=trust -E UTF8 --locale=C
`+pgServer+`
pgbench -h /tmp -U postgres -i -q -s 2 postgres
pgbench -h /tmp -U postgres -n -c 4 -T 3600 postgres > /tmp/pgbench.log 2>&1`), on))
		k.waitPod(ns, "g1", "Running", 180*time.Second)
		rows := func(pod string) int { return pgRows(k, pod) }
		waitPgbench(k, "g1")
		before, start := rows("g1"), time.Now()
		groupSnapshot(k, "g1")
		k.waitFor("group snapshot g1 ready", 180*time.Second, func() (bool, string) {
			r := k.jsonpath(ns, "volumegroupsnapshot/g1", "{.status.readyToUse}")
			return r == "true", r + " " + k.jsonpath(ns, "volumegroupsnapshot/g1", "{.status.error.message}")
		})
		took := time.Since(start)
		if after := rows("g1"); after <= before {
			t.Fatalf("pgbench did not write across the group snapshot (%d history rows before, %d after)", before, after)
		}
		// The snapshot-controller makes a VolumeSnapshot of each member,
		// naming the group in its status.
		members := strings.Fields(k.must("get", "volumesnapshot", "-n", ns, "-o", `jsonpath={range .items[?(@.status.volumeGroupSnapshotName=="g1")]}{.metadata.name} {end}`))
		byHandle := map[string]string{}
		for _, m := range members {
			content := k.jsonpath(ns, "volumesnapshot/"+m, "{.status.boundVolumeSnapshotContentName}")
			byHandle[k.jsonpath("", "volumesnapshotcontent/"+content, "{.spec.source.volumeHandle}")] = m
		}
		restored := map[string]string{}
		for _, c := range []string{"g1-data", "g1-wal"} {
			m, ok := byHandle[volumeHandle(k, c)]
			if !ok || len(members) != 2 {
				t.Fatalf("the group snapshot's members %v name no snapshot of %s", members, c)
			}
			restored[c] = "r-" + c
			k.apply(pvc(restored[c], "128Mi", "Filesystem", "{kind: VolumeSnapshot, name: "+m+", apiGroup: snapshot.storage.k8s.io}"))
		}
		fmt.Printf("e2e      VolumeGroupSnapshot of PostgreSQL's data and pg_wal ready in %.1fs while pgbench wrote (%d history rows before)\n", took.Seconds(), before)
		// The copy holds the running server's postmaster.pid; its pid
		// means nothing in this pod.
		k.apply(onNode(pgPodWAL("g1-restored", restored["g1-data"], restored["g1-wal"], `rm -f /data/pg/postmaster.pid
`+pgServer+`
[ "$(psql -h /tmp -U postgres -Atc '`+pgInvariant+`')" = t ] || { echo "pgbench's invariant is broken" > /tmp/result; exit 0; }
pg_amcheck -h /tmp -U postgres --install-missing --heapallindexed --rootdescend -d postgres > /tmp/amcheck.log 2>&1 || { echo "pg_amcheck found corruption" > /tmp/result; exit 0; }
echo ok > /tmp/result`), to))
		k.waitPod(ns, "g1-restored", "Running", 240*time.Second)
		k.waitFor("the restored server's checks", 240*time.Second, func() (bool, string) {
			out, err := k.run("", "exec", "-n", ns, "g1-restored", "--", "cat", "/tmp/result")
			out = strings.TrimSpace(out)
			if err == nil && out != "" && out != "ok" {
				log, _ := k.run("", "exec", "-n", ns, "g1-restored", "--", "sh", "-c", "cat /tmp/pg.log /tmp/amcheck.log")
				t.Fatalf("the group snapshot restored on %s: %s\n%s", to, out, log)
			}
			return out == "ok", out
		})
		fmt.Printf("e2e      restored on %s: PostgreSQL started, pgbench's invariant holds, pg_amcheck clean (%d history rows)\n", to, rows("g1-restored"))
		k.must("delete", "pod", "-n", ns, "g1", "g1-restored", "--wait=false")
	})
	step(t, "a VolumeGroupSnapshot of claims on two nodes is refused, its error naming both", func() {
		for i, c := range []string{"g2-a", "g2-b"} {
			k.apply(withLabels(pvc(c, "32Mi", "Filesystem", ""), "group: g2"))
			k.apply(onNode(pod(c, c, "", "true"), nodes[i]))
		}
		for _, c := range []string{"g2-a", "g2-b"} {
			k.waitPod(ns, c, "Running", 180*time.Second)
		}
		groupSnapshot(k, "g2")
		var msg string
		k.waitFor("group snapshot g2 refused", 120*time.Second, func() (bool, string) {
			msg = k.jsonpath(ns, "volumegroupsnapshot/g2", "{.status.error.message}")
			if msg == "" {
				// The snapshot-controller copies the content's error.
				c := k.jsonpath(ns, "volumegroupsnapshot/g2", "{.status.boundVolumeGroupSnapshotContentName}")
				if c != "" {
					msg = k.jsonpath("", "volumegroupsnapshotcontent/"+c, "{.status.error.message}")
				}
			}
			return strings.Contains(msg, "must all be on one node") && strings.Contains(msg, nodes[0]) && strings.Contains(msg, nodes[1]), msg
		})
		if r := k.jsonpath(ns, "volumegroupsnapshot/g2", "{.status.readyToUse}"); r == "true" {
			t.Fatal("a group across nodes is ready")
		}
		fmt.Printf("e2e      VolumeGroupSnapshot g2 across %s and %s refused: %s\n", nodes[0], nodes[1], msg)
		k.must("delete", "volumegroupsnapshot", "g2", "-n", ns, "--timeout=120s")
	})
}

// pgPodWAL is pgPod with PostgreSQL's pg_wal on a claim of its own, at
// /wal.
func pgPodWAL(name, data, wal, script string) string {
	return strings.Replace(strings.Replace(pgPod(name, data, script),
		"    volumeMounts: [{name: v, mountPath: /data}]", "    volumeMounts: [{name: v, mountPath: /data}, {name: w, mountPath: /wal}]", 1),
		"    persistentVolumeClaim: {claimName: "+data+"}\n", "    persistentVolumeClaim: {claimName: "+data+"}\n  - name: w\n    persistentVolumeClaim: {claimName: "+wal+"}\n", 1)
}

// watches is how many watches the API server holds now, by resource
// (apiserver_longrunning_requests, verb WATCH, summed over groups and
// scopes).
func watches(t *testing.T, k *kube) map[string]int {
	return apiMetric(t, k, "apiserver_longrunning_requests{", `verb="WATCH"`)
}

// requestWindow is how long requests() counts.
const requestWindow = 15 * time.Second

// requests counts the API server's requests by resource (and "total")
// over d (apiserver_request_total before and after; the metrics reads
// themselves are in it, the same number each time).
func requests(t *testing.T, k *kube, d time.Duration) map[string]int {
	t.Helper()
	before := apiMetric(t, k, "apiserver_request_total{", "")
	time.Sleep(d)
	after := apiMetric(t, k, "apiserver_request_total{", "")
	diff := map[string]int{}
	for r, n := range after {
		diff[r] = n - before[r]
		diff["total"] += n - before[r]
	}
	return diff
}

// apiMetric sums one of the API server's metrics by its resource label,
// over the series whose labels contain match.
func apiMetric(t *testing.T, k *kube, prefix, match string) map[string]int {
	t.Helper()
	out := k.must("get", "--raw", "/metrics")
	n := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, prefix) || !strings.Contains(l, match) {
			continue
		}
		_, rest, ok := strings.Cut(l, `resource="`)
		res, _, ok2 := strings.Cut(rest, `"`)
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if ok && ok2 && err == nil {
			n[res] += int(v)
		}
	}
	return n
}
