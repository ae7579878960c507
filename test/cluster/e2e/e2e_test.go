// Package e2e drives the driver only through Kubernetes objects on the
// local test cluster (make cluster-up): deploy/ applied as a user would,
// then PVCs, pods, snapshots, clones, a database's snapshots under load,
// expansion, block and inline volumes,
// fsGroup, a killed driver pod, and at the end a node with nothing left.
// Run it with make e2e.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	ns        = "hostpath-e2e"
	driverNS  = "hostpath-csi"
	busybox   = "docker.io/library/busybox:1.35"
	stateDir  = "/var/lib/csi-hostpath-data"
	hddPool   = "/var/lib/csi-hostpath-pools/hdd" // deploy/'s second pool, a disk of its own on every node
	podsDir   = "/var/lib/kubelet/pods"
	snapshots = "github.com/kubernetes-csi/external-snapshotter"
)

func TestKubernetes(t *testing.T) {
	if os.Getenv("HOSTPATH_E2E") == "" {
		t.Skip("needs the local cluster: run make e2e (it sets HOSTPATH_E2E)")
	}
	cache := cacheDir()
	k := newKube(t, cache)
	total := time.Now()

	step(t, "snapshot CRDs and snapshot-controller (external-snapshotter v8.7.0) as upstream ships it", func() {
		snapshotAPI(t, k)
	})
	withHelm := os.Getenv("HOSTPATH_E2E_INSTALL") == "helm"
	if withHelm {
		step(t, "charts/hostpath-csi installed with helm install, DaemonSet ready", func() {
			// Only the image reference changes: the driver built here.
			helmInstall(t, k, "install", imageRef(t, filepath.Join(cache, "images", "hostpathplugin.tar")), "--create-namespace")
		})
	} else {
		step(t, "deploy/ applied with kubectl apply -k, DaemonSet ready", func() {
			// Only the image reference changes: the driver built here.
			deployImage(t, k, imageRef(t, filepath.Join(cache, "images", "hostpathplugin.tar")))
		})
	}
	nodes := strings.Fields(k.must("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"))
	step(t, fmt.Sprintf("driver registered with kubelet (CSINode) on %d nodes", len(nodes)), func() {
		k.waitRegistered(nodes)
	})
	if os.Getenv("HOSTPATH_E2E_DEPLOY_ONLY") != "" {
		return // the driver is deployed (make cluster-deploy, make e2e-suite)
	}
	if len(nodes) > 1 {
		manyNodes(t, k, nodes)
		fmt.Printf("e2e total %.1fs\n", time.Since(total).Seconds())
		return
	}
	var capacity0 int64
	step(t, "CSIStorageCapacity published", func() {
		k.waitFor("CSIStorageCapacity", 120*time.Second, func() (bool, string) {
			capacity0 = storageCapacity(k)
			return capacity0 > 0, fmt.Sprint(capacity0)
		})
	})
	k.must("create", "namespace", ns)
	t.Cleanup(func() {
		if t.Failed() {
			fmt.Println(k.events(ns))
			fmt.Println(k.events(driverNS))
		}
	})

	const content = "hello from the e2e test"
	step(t, "PVC (WaitForFirstConsumer) and a pod that writes and reads it", func() {
		k.apply(pvc("data", "64Mi", "Filesystem", ""))
		time.Sleep(2 * time.Second)
		if p := k.jsonpath(ns, "pvc/data", "{.status.phase}"); p != "Pending" {
			t.Fatalf("a WaitForFirstConsumer PVC is %q before any pod uses it", p)
		}
		k.apply(pod("writer", "data", "", fmt.Sprintf("echo %q > /data/hello && head -c 4194304 /dev/urandom > /data/random && sync", content)))
		k.waitPod(ns, "writer", "Running", 180*time.Second)
		waitPodFile(k, "writer", "/data/hello", content, 60*time.Second)
		// The class names no layout: deploy/'s --default-layout makes it
		// an image volume, an ext4 of its own.
		if mnt := mountType(k, "writer"); mnt != "ext4" {
			t.Fatalf("a volume of the default class is mounted as %q in the pod, want ext4 (an image volume)", mnt)
		}
	})
	sum := strings.Fields(k.exec(ns, "writer", "sha256sum", "/data/random"))[0]
	step(t, "a PVC of StorageClass hostpath-hdd lands in the hdd pool, whose capacity is its own disk's", func() {
		k.waitFor("CSIStorageCapacity of hostpath-hdd", 120*time.Second, func() (bool, string) {
			var st unix.Statfs_t
			if err := unix.Statfs(hddPool, &st); err != nil {
				return false, err.Error()
			}
			c, free := classCapacity(k, "hostpath-hdd"), int64(st.Bavail)*st.Bsize
			return c > 0 && c < storageCapacity(k) && near(c, free, 8<<20), fmt.Sprintf("%d published, %d free in %s", c, free, hddPool)
		})
		k.apply(inClass(pvc("hdd", "64Mi", "Filesystem", ""), "hostpath-hdd"))
		k.apply(pod("hdd", "hdd", "", "echo on-hdd > /data/where && sync"))
		k.waitPod(ns, "hdd", "Running", 180*time.Second)
		handle := volumeHandle(k, "hdd")
		// An image volume (the class names no layout): its image is a file
		// in the hdd pool's disk, and the pod's file is in it.
		img := filepath.Join(hddPool, "volumes", handle+".img")
		if _, err := os.Stat(img); err != nil {
			t.Fatalf("the volume's image in the hdd pool's disk: %v", err)
		}
		waitPodFile(k, "hdd", "/data/where", "on-hdd", 60*time.Second)
		fmt.Printf("e2e      volume %s of hostpath-hdd is %s\n", handle, img)
	})
	step(t, "CSIStorageCapacity shrinks as volumes are made", func() {
		k.apply(pvc("filler", "1Gi", "Filesystem", ""))
		k.apply(pod("filler", "filler", "", "true"))
		k.waitFor("smaller capacity", 150*time.Second, func() (bool, string) {
			c := storageCapacity(k)
			return c > 0 && c < capacity0, fmt.Sprintf("%d (was %d)", c, capacity0)
		})
	})
	step(t, "VolumeSnapshot, and a PVC restored from it has the same bytes", func() {
		takeSnapshot(k, "snap", "data")
		sameBytes(k, "restored", "{kind: VolumeSnapshot, name: snap, apiGroup: snapshot.storage.k8s.io}", sum)
	})
	step(t, "PVC cloned from a PVC has the same bytes", func() {
		sameBytes(k, "cloned", "{kind: PersistentVolumeClaim, name: data}", sum)
	})
	step(t, "an image volume (hostpath-image): a VolumeSnapshot taken while a pod appends to a log restores a whole log", func() {
		k.apply(inClass(pvc("img", "64Mi", "Filesystem", ""), "hostpath-image"))
		k.apply(pod("imgwriter", "img", "", `i=0; while :; do echo "record $i" >> /data/log; i=$((i+1)); done`))
		k.waitPod(ns, "imgwriter", "Running", 180*time.Second)
		k.waitFor("the writer under way", 60*time.Second, func() (bool, string) {
			out, err := k.run("", "exec", "-n", ns, "imgwriter", "--", "wc", "-l", "/data/log")
			f := strings.Fields(out)
			n, _ := strconv.Atoi(append(f, "0")[0])
			return err == nil && n > 2000, out
		})
		if mnt := mountType(k, "imgwriter"); mnt != "ext4" {
			t.Fatalf("the image volume is mounted as %q in the pod, want ext4", mnt)
		}
		takeSnapshot(k, "imgsnap", "img")
		k.apply(inClass(pvc("imgrestored", "64Mi", "Filesystem", "{kind: VolumeSnapshot, name: imgsnap, apiGroup: snapshot.storage.k8s.io}"), "hostpath-image"))
		k.apply(pod("imgreader", "imgrestored", "", "true"))
		k.waitPod(ns, "imgreader", "Running", 180*time.Second)
		// Every line whole and in sequence: the cut fell between two
		// appends, never inside one.
		out := k.exec(ns, "imgreader", "awk", `$0 != "record " NR-1 { print "torn at line " NR ": " $0; exit 1 } END { print NR " records" }`, "/data/log")
		fmt.Printf("e2e      the image volume's snapshot, restored, holds %s, whole\n", strings.TrimSpace(out))
		k.must("delete", "pod", "-n", ns, "imgwriter", "--wait=false") // it would write until its volume is full
	})
	step(t, "PostgreSQL on an image volume: VolumeSnapshots taken while pgbench writes restore, start, and pass pgbench's invariant and pg_amcheck", func() {
		postgresSnapshots(k, "hostpath-hdd", 2)
	})
	step(t, "block PVC in a pod (volumeDevices)", func() {
		k.apply(pvc("block", "32Mi", "Block", ""))
		k.apply(pod("block", "block", "block", "printf 'block-data' | dd of=/dev/xvda bs=512 seek=100 conv=fsync 2>/dev/null"))
		k.waitPod(ns, "block", "Running", 180*time.Second)
		k.waitFor("block data", 60*time.Second, func() (bool, string) {
			out, _ := k.run("", "exec", "-n", ns, "block", "--", "dd", "if=/dev/xvda", "bs=512", "skip=100", "count=1")
			return strings.HasPrefix(out, "block-data"), out
		})
	})
	step(t, "online expansion seen inside the pods", func() {
		k.apply(inClass(pvc("dirdata", "64Mi", "Filesystem", ""), "hostpath-directory"))
		k.apply(pod("dirdata", "dirdata", "", "true"))
		k.waitPod(ns, "dirdata", "Running", 180*time.Second)
		k.must("patch", "pvc", "block", "-n", ns, "-p", `{"spec":{"resources":{"requests":{"storage":"64Mi"}}}}`)
		k.must("patch", "pvc", "dirdata", "-n", ns, "-p", `{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}`)
		k.must("patch", "pvc", "data", "-n", ns, "-p", `{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}`)
		k.waitFor("device grown in the pod", 120*time.Second, func() (bool, string) {
			out, _ := k.run("", "exec", "-n", ns, "block", "--", "blockdev", "--getsize64", "/dev/xvda")
			return strings.TrimSpace(out) == strconv.Itoa(64<<20), out
		})
		k.waitFor("the directory volume's PVC capacity", 120*time.Second, func() (bool, string) {
			c := k.jsonpath(ns, "pvc/dirdata", "{.status.capacity.storage}")
			return c == "128Mi", c
		})
		// An image volume's file system grows online through ext4's resize
		// ioctl, which needs CAP_SYS_RESOURCE. Where this host's root has
		// none (its bounding set lacks it, and so does every container
		// here), the expansion must say so rather than hang or lie.
		if hostCanResize(t) {
			k.waitFor("the image volume grown in the pod", 120*time.Second, func() (bool, string) {
				c := k.jsonpath(ns, "pvc/data", "{.status.capacity.storage}")
				out, _ := k.run("", "exec", "-n", ns, "writer", "--", "df", "-k", "/data")
				return c == "128Mi", c + "\n" + out
			})
			return
		}
		k.waitFor("the image volume's expansion refused, saying why", 120*time.Second, func() (bool, string) {
			ev := k.events(ns)
			return strings.Contains(ev, "needs CAP_SYS_RESOURCE"), ev
		})
		fmt.Println("e2e      this host's root lacks CAP_SYS_RESOURCE: the image volume's online expansion is refused with its reason (it grows in make test-kernel's guests)")
	})
	step(t, "an XFS image volume (hostpath-image-xfs): XFS in its pod, grown online while the pod writes", func() {
		k.apply(inClass(pvc("xfsdata", "300Mi", "Filesystem", ""), "hostpath-image-xfs"))
		k.apply(pod("xfswriter", "xfsdata", "", `while :; do date >> /data/log; sleep 0.1; done`))
		k.waitPod(ns, "xfswriter", "Running", 180*time.Second)
		if mnt := mountType(k, "xfswriter"); mnt != "xfs" {
			t.Fatalf("a volume of hostpath-image-xfs is mounted as %q in the pod, want xfs", mnt)
		}
		lines := func() int {
			out, _ := k.run("", "exec", "-n", ns, "xfswriter", "--", "wc", "-l", "/data/log")
			n, _ := strconv.Atoi(append(strings.Fields(out), "0")[0])
			return n
		}
		// XFS grows through XFS_IOC_FSGROWFSDATA, which needs only the
		// CAP_SYS_ADMIN the driver mounts with: online, here too.
		k.must("patch", "pvc", "xfsdata", "-n", ns, "-p", `{"spec":{"resources":{"requests":{"storage":"600Mi"}}}}`)
		k.waitFor("the XFS volume grown in the pod", 180*time.Second, func() (bool, string) {
			c := k.jsonpath(ns, "pvc/xfsdata", "{.status.capacity.storage}")
			out, _ := k.run("", "exec", "-n", ns, "xfswriter", "--", "df", "-k", "/data")
			f := strings.Fields(out)
			total := 0
			if len(f) >= 9 {
				total, _ = strconv.Atoi(f[8])
			}
			// 600 MiB less the 64 MiB internal log, which df does not count.
			return c == "600Mi" && total > 500<<10, c + "\n" + out
		})
		before := lines()
		k.waitFor("the pod still writing after the growth", 60*time.Second, func() (bool, string) {
			n := lines()
			return n > before+5, fmt.Sprint(n, " lines, ", before, " before")
		})
		fmt.Printf("e2e      the XFS image volume grew to 600Mi online; its pod wrote on (%d lines)\n", lines())
		k.must("delete", "pod", "-n", ns, "xfswriter", "--wait=false")
	})
	step(t, "CSI inline ephemeral volume", func() {
		k.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: inline, namespace: %s}
spec:
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "echo inline > /data/f && sleep 3600"]
    volumeMounts: [{name: v, mountPath: /data}]
  volumes:
  - name: v
    csi: {driver: hostpath.csi.k8s.io, volumeAttributes: {size: 16Mi}}
`, ns, busybox))
		k.waitPod(ns, "inline", "Running", 180*time.Second)
		waitPodFile(k, "inline", "/data/f", "inline", 30*time.Second)
	})
	step(t, "fsGroup on a non-root pod", func() {
		k.apply(pvc("fsgroup", "16Mi", "Filesystem", ""))
		k.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: nonroot, namespace: %s}
spec:
  securityContext: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000, runAsNonRoot: true}
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", "echo x > /data/mine && sleep 3600"]
    volumeMounts: [{name: v, mountPath: /data}]
  volumes:
  - name: v
    persistentVolumeClaim: {claimName: fsgroup}
`, ns, busybox))
		k.waitPod(ns, "nonroot", "Running", 180*time.Second)
		k.waitFor("non-root write", 30*time.Second, func() (bool, string) {
			out, _ := k.run("", "exec", "-n", ns, "nonroot", "--", "stat", "-c", "%u:%g", "/data/mine")
			return strings.TrimSpace(out) == "1000:2000", out
		})
	})
	step(t, "I/O limits through VolumeAttributesClass: fio in a pod held to its class's, changed online", func() {
		ioLimits(k)
	})
	step(t, "driver pod killed and rescheduled, every volume still served", func() {
		old := strings.TrimSpace(k.must("get", "pods", "-n", driverNS, "-o", "jsonpath={.items[0].metadata.name}"))
		k.must("delete", "pod", "-n", driverNS, old, "--grace-period=0", "--force")
		k.waitFor("new driver pod", 180*time.Second, func() (bool, string) {
			name := k.jsonpath(driverNS, "pods", "{.items[0].metadata.name}")
			ready := k.jsonpath(driverNS, "pods", "{.items[0].status.containerStatuses[*].ready}")
			return name != "" && name != old && !strings.Contains(ready, "false") && ready != "", name + " " + ready
		})
		if got := strings.TrimSpace(k.exec(ns, "writer", "cat", "/data/hello")); got != content {
			t.Fatalf("after the restart the volume reads %q", got)
		}
		out := k.exec(ns, "block", "dd", "if=/dev/xvda", "bs=512", "skip=100", "count=1")
		if !strings.HasPrefix(out, "block-data") {
			t.Fatalf("after the restart the block volume reads %q", out)
		}
		// And new work goes through the new driver pod.
		k.apply(pvc("after", "16Mi", "Filesystem", ""))
		k.apply(pod("after", "after", "", "echo after > /data/f"))
		k.waitPod(ns, "after", "Running", 180*time.Second)
	})
	step(t, "everything deleted: no mount, loop device, volume or snapshot left", func() {
		k.must("delete", "namespace", ns, "--timeout=300s")
		k.waitFor("PVs deleted", 180*time.Second, func() (bool, string) {
			pvs := k.items("pv")
			return len(pvs) == 0, fmt.Sprintf("%d PVs", len(pvs))
		})
		k.waitFor("snapshot contents deleted", 120*time.Second, func() (bool, string) {
			c := k.items("volumesnapshotcontents")
			return len(c) == 0, fmt.Sprintf("%d contents", len(c))
		})
		k.waitFor("node clean", 60*time.Second, func() (bool, string) {
			left := nodeLeftovers()
			return len(left) == 0, strings.Join(left, "; ")
		})
	})
	if withHelm {
		helmUpgradeUninstall(t, k, imageRef(t, filepath.Join(cache, "images", "hostpathplugin.tar")))
	}
	fmt.Printf("e2e total %.1fs\n", time.Since(total).Seconds())
}

// helm runs the helm built for the tests against the cluster.
func helm(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(cacheDir(), "bin", "helm"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(cacheDir(), "cluster", "admin.kubeconfig"), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// helmInstall installs (or upgrades: verb) the chart with the driver's
// image ref and waits for the DaemonSet.
func helmInstall(t *testing.T, k *kube, verb, ref string, extra ...string) {
	t.Helper()
	repo, _ := filepath.Abs("../../..")
	i := strings.LastIndex(ref, ":")
	args := append([]string{verb, "hostpath-csi", filepath.Join(repo, "charts", "hostpath-csi"), "--namespace", driverNS,
		"--set", "image.repository=" + ref[:i], "--set", "image.tag=" + ref[i+1:], "--wait", "--timeout", "5m"}, extra...)
	helm(t, args...)
	if _, err := k.run("", "rollout", "status", "-n", driverNS, "daemonset/hostpath-csi-node", "--timeout=300s"); err != nil {
		t.Fatalf("%v\n%s\n%s", err, k.describe(driverNS, "pods"), k.events(driverNS))
	}
}

// helmUpgradeUninstall changes a value with helm upgrade (the DaemonSet
// rolls, the new pods serve), then helm uninstall: nothing of the chart
// or of what the drivers made (the transfer authority's Secret, capacity
// objects) is left, and no driver process.
func helmUpgradeUninstall(t *testing.T, k *kube, ref string) {
	step(t, "helm upgrade (log level 4) rolls the DaemonSet", func() {
		helmInstall(t, k, "upgrade", ref, "--reuse-values", "--set", "logLevel=4")
		if args := k.jsonpath(driverNS, "daemonset/hostpath-csi-node", "{.spec.template.spec.containers[0].args}"); !strings.Contains(args, "-v=4") {
			t.Fatalf("after helm upgrade the driver's args are %s", args)
		}
		k.waitFor("driver registered again", 120*time.Second, func() (bool, string) {
			d := k.jsonpath("", "csinode/"+k.must("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"), "{.spec.drivers[*].name}")
			return strings.Contains(d, "hostpath.csi.k8s.io"), d
		})
		if h := helm(t, "history", "hostpath-csi", "--namespace", driverNS); !strings.Contains(h, "deployed") || strings.Count(h, "\n") < 3 {
			t.Fatalf("helm history after the upgrade:\n%s", h)
		}
	})
	step(t, "helm uninstall leaves nothing behind", func() {
		helm(t, "uninstall", "hostpath-csi", "--namespace", driverNS, "--wait", "--timeout", "5m")
		k.waitFor("nothing of the chart or the drivers left", 180*time.Second, func() (bool, string) {
			var left []string
			for _, what := range []string{"daemonsets,deployments,pods,secrets,configmaps,roles,rolebindings,serviceaccounts,csistoragecapacities,leases.coordination.k8s.io"} {
				out, _ := k.run("", "get", what, "-n", driverNS, "-o", "name")
				for _, l := range strings.Fields(out) {
					// The controller's sidecars' leader-election Leases are
					// theirs, not the chart's (as any CSI controller's):
					// they go with the namespace.
					if l == "lease.coordination.k8s.io/external-resizer-hostpath-csi-k8s-io" || l == "lease.coordination.k8s.io/external-snapshotter-leader-hostpath-csi-k8s-io" {
						continue
					}
					if !strings.HasPrefix(l, "serviceaccount/default") && !strings.HasPrefix(l, "secret/default-token") && l != "configmap/kube-root-ca.crt" {
						left = append(left, l)
					}
				}
			}
			// The nodes' certificate requests, owned by the CSIDriver.
			if out, _ := k.run("", "get", "csr", "-o", `jsonpath={range .items[?(@.spec.signerName=="hostpath.csi.k8s.io/transfer")]}{.metadata.name} {end}`); strings.TrimSpace(out) != "" {
				left = append(left, "certificate requests "+strings.TrimSpace(out))
			}
			for _, obj := range []string{"csidriver/hostpath.csi.k8s.io", "storageclass/hostpath", "storageclass/hostpath-hdd", "volumesnapshotclass/hostpath", "clusterrole/hostpath-csi-node", "clusterrolebinding/hostpath-csi-node", "clusterrole/hostpath-csi-transfer-signer", "clusterrolebinding/hostpath-csi-transfer-signer", "clusterrole/hostpath-csi-controller", "clusterrolebinding/hostpath-csi-controller", "volumegroupsnapshotclass/hostpath"} {
				if _, err := k.run("", "get", obj); err == nil {
					left = append(left, obj)
				}
			}
			if out, _ := exec.Command("pgrep", "-f", "hostpathplugin").Output(); len(strings.TrimSpace(string(out))) > 0 {
				left = append(left, "hostpathplugin processes "+strings.Join(strings.Fields(string(out)), ","))
			}
			return len(left) == 0, strings.Join(left, " ")
		})
	})
}

// takeSnapshot makes a VolumeSnapshot of the claim and waits until it is
// ready to use.
func takeSnapshot(k *kube, name, claim string) {
	k.t.Helper()
	k.apply(fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: %s, namespace: %s}
spec:
  volumeSnapshotClassName: hostpath
  source: {persistentVolumeClaimName: %s}
`, name, ns, claim))
	start := time.Now()
	waitSnapshot(k, name)
	fmt.Printf("e2e      VolumeSnapshot %s of %s ready to use %.1fs after it was made\n", name, claim, time.Since(start).Seconds())
}

// waitSnapshot waits until a VolumeSnapshot is ready to use.
func waitSnapshot(k *kube, name string) {
	k.t.Helper()
	k.waitFor("snapshot "+name+" ready", 120*time.Second, func() (bool, string) {
		r := k.jsonpath(ns, "volumesnapshot/"+name, "{.status.readyToUse}")
		return r == "true", r + " " + k.jsonpath(ns, "volumesnapshot/"+name, "{.status.error.message}")
	})
}

// deployImage applies deploy/ with the driver's image set to ref and waits
// for the DaemonSet to roll it out on every node.
func deployImage(t *testing.T, k *kube, ref string) {
	t.Helper()
	repo, _ := filepath.Abs("../../..")
	deployFrom(t, k, filepath.Join(repo, "deploy"), ref)
}

// deployFrom applies the kustomization in dir (a release's deploy/) with
// the driver's image ref, and waits for the rollout.
func deployFrom(t *testing.T, k *kube, dir, ref string) {
	t.Helper()
	i := strings.LastIndex(ref, ":")
	applyOverlay(t, k, dir, ref[:i], ref[i+1:], "")
	if _, err := k.run("", "rollout", "status", "-n", driverNS, "daemonset/hostpath-csi-node", "--timeout=300s"); err != nil {
		t.Fatalf("%v\n%s\n%s", err, k.describe(driverNS, "pods"), k.events(driverNS))
	}
	// Releases since the controller have one (the previous may not).
	if _, err := os.Stat(filepath.Join(dir, "controller.yaml")); err == nil {
		if _, err := k.run("", "rollout", "status", "-n", driverNS, "deployment/hostpath-csi-controller", "--timeout=300s"); err != nil {
			t.Fatalf("%v\n%s\n%s", err, k.describe(driverNS, "pods"), k.events(driverNS))
		}
	}
}

// sameBytes makes a PVC from source, reads it in a pod and compares the
// random file's sha256 with want.
func sameBytes(k *kube, name, source, want string) {
	k.t.Helper()
	k.apply(pvc(name, "64Mi", "Filesystem", source))
	k.apply(pod("reader-"+name, name, "", "true"))
	k.waitPod(ns, "reader-"+name, "Running", 180*time.Second)
	if got := strings.Fields(k.exec(ns, "reader-"+name, "sha256sum", "/data/random"))[0]; got != want {
		k.t.Fatalf("%s data differs: %s vs %s", name, got, want)
	}
}

// snapshotAPI installs the snapshot CRDs and upstream's snapshot-controller
// as a user does before deploy/.
func snapshotAPI(t *testing.T, k *kube) {
	t.Helper()
	k.must("apply", "-k", filepath.Join(moduleDir(t, snapshots+"/client/v8@v8.7.0"), "config", "crd"))
	snapshotController(t, k, false)
}

// snapshotController deploys external-snapshotter's snapshot-controller
// from its own manifests: as upstream ships it (no flag), or with
// distributed snapshotting on, as the releases before the controller
// asked for (each node's snapshotter then handles the contents the
// controller labels with their volume's node).
func snapshotController(t *testing.T, k *kube, distributed bool) {
	t.Helper()
	// Its manifest still names v8.6.0; the controller built here is
	// v8.7.0.
	patches := ""
	if distributed {
		patches = `patches:
- target: {kind: Deployment, name: snapshot-controller}
  patch: |-
    - {op: add, path: /spec/template/spec/containers/0/args/-, value: --enable-distributed-snapshotting}
- target: {kind: ClusterRole, name: snapshot-controller-runner}
  patch: |-
    - {op: add, path: /rules/-, value: {apiGroups: [""], resources: [nodes], verbs: [get, list, watch]}}
`
	}
	applyOverlay(t, k, filepath.Join(moduleDir(t, snapshots+"/v8@v8.7.0"), "deploy", "kubernetes", "snapshot-controller"),
		"registry.k8s.io/sig-storage/snapshot-controller", "v8.7.0", patches)
	k.must("rollout", "status", "-n", "kube-system", "deployment/snapshot-controller", "--timeout=180s")
}

// applyOverlay applies the kustomization in base with one image's tag
// changed, as a user pins an image: an overlay naming base, with extra
// kustomization text (patches) if given.
func applyOverlay(t *testing.T, k *kube, base, image, tag, extra string) {
	t.Helper()
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		t.Fatal(err)
	}
	kz := fmt.Sprintf("resources:\n- %s\nimages:\n- name: %s\n  newTag: %s\n%s", rel, image, tag, extra)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kz), 0o644); err != nil {
		t.Fatal(err)
	}
	k.must("apply", "-k", overlay)
}

// inClass puts a PVC manifest in another StorageClass.
// waitPodFile waits until a file in a pod holds want (its spaces around
// trimmed).
func waitPodFile(k *kube, pod, file, want string, timeout time.Duration) {
	k.waitFor(file+" in "+pod, timeout, func() (bool, string) {
		out, err := k.run("", "exec", "-n", ns, pod, "--", "cat", file)
		return err == nil && strings.TrimSpace(out) == want, out
	})
}

// volumeHandle is the driver's volume id of a bound claim.
func volumeHandle(k *kube, claim string) string {
	return k.jsonpath("", "pv/"+k.jsonpath(ns, "pvc/"+claim, "{.spec.volumeName}"), "{.spec.csi.volumeHandle}")
}

// mountType is the file system type of /data in a pod.
func mountType(k *kube, pod string) string {
	return strings.TrimSpace(k.exec(ns, pod, "sh", "-c", "grep ' /data ' /proc/mounts | cut -d' ' -f3"))
}

// hostCanResize reports whether this process's bounding set holds
// CAP_SYS_RESOURCE, and so whether the cluster's privileged containers
// may: ext4's online resize needs it.
func hostCanResize(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				t.Fatalf("CapBnd %q: %v", v, err)
			}
			return n&(1<<unix.CAP_SYS_RESOURCE) != 0
		}
	}
	t.Fatal("no CapBnd in /proc/self/status")
	return false
}

func inClass(manifest, class string) string {
	return strings.Replace(manifest, "storageClassName: hostpath\n", "storageClassName: "+class+"\n", 1)
}

func pvc(name, size, mode, source string) string {
	out := fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s}
spec:
  storageClassName: hostpath
  accessModes: [ReadWriteOnce]
  volumeMode: %s
  resources: {requests: {storage: %s}}
`, name, ns, mode, size)
	if source != "" {
		out += "  dataSourceRef: " + source + "\n"
	}
	return out
}

// pod runs busybox with the claim at /data (or as /dev/xvda for a block
// claim): the script, then sleep.
func pod(name, claim, block, script string) string {
	mount := "    volumeMounts: [{name: v, mountPath: /data}]"
	if block != "" {
		mount = "    volumeDevices: [{name: v, devicePath: /dev/xvda}]"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
%s
  volumes:
  - name: v
    persistentVolumeClaim: {claimName: %s}
`, name, ns, busybox, script+" && sleep 3600", mount, claim)
}

// storageCapacity is the capacity the driver's CSIStorageCapacity object
// for the hostpath class reports, 0 if there is none yet.
func storageCapacity(k *kube) int64 { return classCapacity(k, "hostpath") }

// classCapacity is what the CSIStorageCapacity of a StorageClass reports
// (on the one node), 0 if there is none.
func classCapacity(k *kube, class string) int64 {
	for _, c := range k.items("csistoragecapacities", "-A") {
		if c["storageClassName"] != class {
			continue
		}
		if q, ok := c["capacity"].(string); ok {
			return parseQuantity(q)
		}
	}
	return 0
}

// parseQuantity reads the plain and binary-suffixed integers a
// CSIStorageCapacity carries.
func parseQuantity(q string) int64 {
	mult := int64(1)
	for suf, m := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12} {
		if strings.HasSuffix(q, suf) {
			q, mult = strings.TrimSuffix(q, suf), m
			break
		}
	}
	n, _ := strconv.ParseInt(q, 10, 64)
	return n * mult
}

// nodeLeftovers lists what the driver left on this node: CSI mounts of
// pods, loop devices of its block volumes, volume and snapshot data.
func nodeLeftovers() []string { return leftoversIn("/", "/proc/self/mountinfo") }
