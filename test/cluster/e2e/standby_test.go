package e2e

import (
	"bytes"
	"fmt"
	"os"
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
