package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// standbyClass keeps a copy of each volume on a second node, caught up
// every 2 s, in the hdd pool (an XFS on every node of the cluster: a pool
// that shares blocks).
const standbyClass = `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: hostpath-standby}
provisioner: hostpath.csi.k8s.io
parameters: {pool: hdd, layout: image, standby: "1", standbyInterval: 2s}
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
`

// newestGeneration is the path of the newest generation of volume id's
// standby copy on node, "" while there is none.
func newestGeneration(t *testing.T, node, id string) string {
	t.Helper()
	gens, _ := filepath.Glob(filepath.Join(nodeRoot(t, node), hddPool, "standby", id, "gen-*.img"))
	slices.Sort(gens)
	if len(gens) == 0 {
		return ""
	}
	return gens[len(gens)-1]
}

// generationHolds is a wait condition: the newest generation of volume
// id's copy on node holds want.
func generationHolds(t *testing.T, node, id, want string) func() (bool, string) {
	return func() (bool, string) {
		g := newestGeneration(t, node, id)
		if g == "" {
			return false, "no generation yet on " + node
		}
		b, err := os.ReadFile(g)
		return err == nil && bytes.Contains(b, []byte(want)), fmt.Sprintf("%s (%d bytes, %v) lacks %q", g, len(b), err, want)
	}
}

// standbyClaim makes claim name of the standby class and a pod of it that
// runs script, waits for the pod to run and for the standby's copy to hold
// want, and returns the pod's node, the volume's id and its standby's node.
func standbyClaim(t *testing.T, k *kube, name, script, want string) (primary, id, standby string) {
	t.Helper()
	k.apply(inClass(pvc(name, "64Mi", "Filesystem", ""), "hostpath-standby"))
	k.apply(pod(name, name, "", script))
	k.waitPod(ns, name, "Running", 180*time.Second)
	primary = k.jsonpath(ns, "pod/"+name, "{.spec.nodeName}")
	pv := k.jsonpath(ns, "pvc/"+name, "{.spec.volumeName}")
	id = k.jsonpath("", "pv/"+pv, "{.spec.csi.volumeHandle}")
	standby = k.jsonpath("", "pv/"+pv, `{.spec.csi.volumeAttributes.hostpath\.csi/standby}`)
	k.waitFor("the standby's copy holding "+want, 60*time.Second, generationHolds(t, standby, id, want))
	return primary, id, standby
}

// copiesGone waits until volume id's standby directory is gone on each
// of nodes (its copy, or its primary's cuts): the claim was deleted.
func copiesGone(t *testing.T, k *kube, id string, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		k.waitFor("volume "+id+"'s standby files removed with the claim on "+n, 120*time.Second, func() (bool, string) {
			_, err := os.Stat(filepath.Join(nodeRoot(t, n), hddPool, "standby", id))
			return os.IsNotExist(err), fmt.Sprintf("%v", err)
		})
	}
}

// standbyFailover: the primary's node stopped as a power cut would (every
// process and mount gone) and fenced with the out-of-service taint, a pod
// of the claim runs on the standby's node with what was synced there
// before the cut; the node started again becomes the volume's standby on
// its own and catches up with what the pod wrote since.
func standbyFailover(t *testing.T, k *kube) {
	step(t, "the primary's node cut off and fenced: the pod runs on the standby's node with what it had synced, and the node back becomes the standby", func() {
		k.apply(standbyClass)
		defer k.run("", "delete", "storageclass", "hostpath-standby")
		primary, id, standby := standbyClaim(t, k, "fo", "echo synced-before-the-cut > /data/f && sync", "synced-before-the-cut")

		localcluster(t, "node-stop", primary)
		k.must("taint", "node", primary, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
		fenced := time.Now()
		// The pod the cut node ran is gone (pod GC force-deletes it under
		// the taint once the node is NotReady; an administrator may too).
		k.must("delete", "pod", "fo", "-n", ns, "--force", "--grace-period=0")
		k.apply(onNode(pod("fo2", "fo", "", "cat /data/f > /data/seen && echo written-after-the-failover > /data/g && sync"), standby))
		k.waitPod(ns, "fo2", "Running", 120*time.Second)
		took := time.Since(fenced)
		if got := k.exec(ns, "fo2", "cat", "/data/seen"); !strings.Contains(got, "synced-before-the-cut") {
			t.Fatalf("the promoted volume reads %q, want the write synced before the cut", got)
		}
		if took > 60*time.Second {
			t.Errorf("the pod ran on the standby's node %v after the taint, want within 60 s", took)
		}

		localcluster(t, "node-start", primary)
		k.must("taint", "node", primary, "node.kubernetes.io/out-of-service-")
		back := time.Now()
		k.waitFor("CSINode of "+primary+" and the node Ready", 240*time.Second, func() (bool, string) {
			d, _ := k.run("", "get", "csinode", primary, "-o", "jsonpath={.spec.drivers[*].name}")
			r := k.jsonpath("", "node/"+primary, `{.status.conditions[?(@.type=="Ready")].status}`)
			return strings.Contains(d, "hostpath.csi.k8s.io") && r == "True", d + " " + r
		})
		k.waitFor("the node back holding the standby copy with the write made after the failover", 240*time.Second,
			generationHolds(t, primary, id, "written-after-the-failover"))
		fmt.Printf("e2e      volume %s: %s cut off and fenced; the pod ran on %s %v after the taint, with the write synced before the cut; %s, back, held the copy with the write made after the failover %v later\n",
			id, primary, standby, took.Round(100*time.Millisecond), primary, time.Since(back).Round(time.Second))
		k.must("delete", "pod", "fo2", "-n", ns, "--grace-period=1")
		k.must("delete", "pvc", "fo", "-n", ns)
		copiesGone(t, k, id, primary, standby)
	})
}

// standbyPartition: the primary's node cut off the network without a
// fence (its veth on the host's bridge down): a pod of the claim made on
// the standby's node is not given the volume, and its events say why (the
// primary, not fenced, and how to fence it); with the network back, the
// pod on the primary still runs with every write, the ones made while it
// was cut off among them.
func standbyPartition(t *testing.T, k *kube) {
	step(t, "the primary's node cut off the network, not fenced: no promotion, the pod's events say why, and nothing is lost when the network returns", func() {
		k.apply(standbyClass)
		defer k.run("", "delete", "storageclass", "hostpath-standby")
		primary, id, standby := standbyClaim(t, k, "pt", "echo written-before-the-partition > /data/f && sync", "written-before-the-partition")

		veth := "hp-" + primary
		ip := func(args ...string) {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
		ip("link", "set", veth, "down")
		reconnected := false
		defer func() {
			if !reconnected {
				exec.Command("ip", "link", "set", veth, "up").Run()
			}
		}()
		cut := time.Now()
		k.apply(onNode(pod("pt2", "pt", "", "cat /data/f"), standby))
		var said string
		k.waitFor("pt2's events saying why it gets no volume", 150*time.Second, func() (bool, string) {
			said, _ = k.run("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=pt2", "-o", "jsonpath={.items[*].message}")
			return strings.Contains(said, primary) && strings.Contains(said, "out-of-service"), said
		})
		if p := k.jsonpath(ns, "pod/pt2", "{.status.phase}"); p == "Running" {
			t.Fatalf("pt2 runs on %s while %s, not fenced, may still be writing", standby, primary)
		}
		if _, err := os.Stat(filepath.Join(nodeRoot(t, standby), hddPool, "volumes", id+".img")); err == nil {
			t.Fatalf("%s promoted volume %s without a fence", standby, id)
		}
		k.must("delete", "pod", "pt2", "-n", ns, "--grace-period=1")
		ip("link", "set", veth, "up")
		reconnected = true
		k.waitFor(primary+" Ready again", 180*time.Second, func() (bool, string) {
			r := k.jsonpath("", "node/"+primary, `{.status.conditions[?(@.type=="Ready")].status}`)
			return r == "True", r
		})
		k.exec(ns, "pt", "sh", "-c", "echo written-after-the-partition >> /data/f && sync")
		if got := k.exec(ns, "pt", "cat", "/data/f"); !strings.Contains(got, "written-before-the-partition") || !strings.Contains(got, "written-after-the-partition") {
			t.Fatalf("the volume on %s after the partition reads %q", primary, got)
		}
		fmt.Printf("e2e      %s cut off for %v without a fence: the pod made on %s got no volume; its event: %s\n",
			primary, time.Since(cut).Round(time.Second), standby, lastLine(said))
		k.must("delete", "pod", "pt", "-n", ns, "--grace-period=1")
		k.must("delete", "pvc", "pt", "-n", ns)
		copiesGone(t, k, id, standby)
	})
}

// lastLine is the last of the messages in s (kubectl joins them with
// spaces; each of the driver's starts with "MountVolume").
func lastLine(s string) string {
	if i := strings.LastIndex(s, "MountVolume"); i >= 0 {
		return s[i:]
	}
	return s
}

// standbyCopies: a claim of a standby class gets a copy on another node
// than its pod's, named in its PV; what the pod writes and syncs is in the
// standby's newest generation within a few intervals; a pod made again on
// the standby's node gets the volume moved there with every write, and
// back; the copy goes with the claim.
func standbyCopies(t *testing.T, k *kube, nodes []string) {
	step(t, "a standby copy on a second node holds what the pod wrote within a few intervals, the volume moves to it and back with every write, and the copy goes with the claim", func() {
		k.apply(standbyClass)
		defer k.run("", "delete", "storageclass", "hostpath-standby")
		k.apply(inClass(pvc("stby", "64Mi", "Filesystem", ""), "hostpath-standby"))
		k.apply(pod("stby", "stby", "", "echo standby-first-write > /data/f && sync"))
		k.waitPod(ns, "stby", "Running", 180*time.Second)
		primary := k.jsonpath(ns, "pod/stby", "{.spec.nodeName}")
		pv := k.jsonpath(ns, "pvc/stby", "{.spec.volumeName}")
		id := k.jsonpath("", "pv/"+pv, "{.spec.csi.volumeHandle}")
		standby := k.jsonpath("", "pv/"+pv, `{.spec.csi.volumeAttributes.hostpath\.csi/standby}`)
		if standby == "" || standby == primary || !slices.Contains(nodes, standby) {
			t.Fatalf("PV %s names standby %q for a volume on %s", pv, standby, primary)
		}
		holds := func(want string) func() (bool, string) { return generationHolds(t, standby, id, want) }
		start := time.Now()
		k.waitFor("the standby's copy holding the first write", 60*time.Second, holds("standby-first-write"))
		first := time.Since(start)
		k.exec(ns, "stby", "sh", "-c", "echo standby-second-write > /data/g && sync")
		start = time.Now()
		k.waitFor("the standby's copy holding the second write", 60*time.Second, holds("standby-second-write"))
		fmt.Printf("e2e      volume %s on %s, its standby on %s (%s): the first write there %v after the pod ran, the second %v after its sync\n",
			id, primary, standby, filepath.Base(newestGeneration(t, standby, id)), first.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))

		// Moved: the pod comes back on the standby's node, as a drain
		// reschedules it (its PV admits both nodes); the volume moves
		// there with every write synced on the first node, and back.
		move := func(to, script, want string) time.Duration {
			k.must("delete", "pod", "stby", "-n", ns, "--grace-period=1")
			start := time.Now()
			k.apply(onNode(pod("stby", "stby", "", script), to))
			k.waitPod(ns, "stby", "Running", 180*time.Second)
			took := time.Since(start)
			if on := k.jsonpath(ns, "pod/stby", "{.spec.nodeName}"); on != to {
				t.Fatalf("the pod runs on %s, not %s", on, to)
			}
			k.waitFor("the moved volume holding every write", 30*time.Second, func() (bool, string) {
				out, _ := k.run("", "exec", "-n", ns, "stby", "--", "cat", "/data/seen")
				return strings.Contains(out, want), fmt.Sprintf("/data/seen holds %q, want %q", out, want)
			})
			return took
		}
		there := move(standby, "cat /data/f /data/g > /data/seen && echo written-on-the-standby > /data/h && sync", "standby-second-write")
		back := move(primary, "cat /data/h > /data/seen && sync", "written-on-the-standby")
		fmt.Printf("e2e      moved to %s with every write: its pod ran %v after it was made there; moved back to %s with what it wrote there in %v\n",
			standby, there.Round(100*time.Millisecond), primary, back.Round(100*time.Millisecond))
		k.must("delete", "pod", "stby", "-n", ns, "--grace-period=1")
		k.must("delete", "pvc", "stby", "-n", ns)
		copiesGone(t, k, id, standby)
	})
}
