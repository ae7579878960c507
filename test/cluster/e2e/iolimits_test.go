package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// fioImage is Debian's fio of this machine, built into an image by
// test/cluster (images/fio-files) and imported into every node.
const fioImage = "localhost:1/hostpath-e2e/fio:3"

// ioLimits: per-volume I/O limits through VolumeAttributesClass, with
// fio in a pod measuring them. A claim of class slow (1,000 IOPS each
// way) reads at that rate within 10%; its class changed to fast (10,000)
// while the pod runs, it reads at that; a claim with no class in the
// same pod is not held to either; a class with a limit that is not a
// positive integer is refused (the claim says Infeasible) and the limit
// in force stays, in the pod's cgroups as in the measured rate.
func ioLimits(k *kube) {
	k.t.Helper()
	for _, c := range []struct{ name, iops string }{{"slow", "1000"}, {"fast", "10000"}, {"bad", "-5"}} {
		k.apply(fmt.Sprintf(`apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {name: hostpath-e2e-%s}
driverName: hostpath.csi.k8s.io
parameters: {readIOPS: %q, writeIOPS: %q}
`, c.name, c.iops, c.iops))
	}
	k.t.Cleanup(func() {
		k.run("", "delete", "volumeattributesclass", "hostpath-e2e-slow", "hostpath-e2e-fast", "hostpath-e2e-bad", "--wait=false")
	})
	k.apply(strings.Replace(pvc("limited", "256Mi", "Filesystem", ""), "  storageClassName: hostpath\n", "  storageClassName: hostpath\n  volumeAttributesClassName: hostpath-e2e-slow\n", 1))
	k.apply(pvc("unlimited", "256Mi", "Filesystem", ""))
	k.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: fio, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sleep", "3600"]
    volumeMounts: [{name: l, mountPath: /limited}, {name: u, mountPath: /unlimited}]
  volumes:
  - {name: l, persistentVolumeClaim: {claimName: limited}}
  - {name: u, persistentVolumeClaim: {claimName: unlimited}}
`, ns, fioImage))
	k.waitPod(ns, "fio", "Running", 180*time.Second)
	iops := func(dir string) float64 {
		k.t.Helper()
		out := k.exec(ns, "fio", "fio", "--name=r", "--filename="+dir+"/f", "--size=64M", "--direct=1", "--rw=randread",
			"--bs=4k", "--ioengine=psync", "--runtime=4", "--time_based", "--output-format=json")
		var r struct {
			Jobs []struct{ Read struct{ IOPS float64 } }
		}
		if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &r); err != nil || len(r.Jobs) != 1 {
			k.t.Fatalf("fio's output: %v\n%s", err, out)
		}
		return r.Jobs[0].Read.IOPS
	}
	within := func(what string, got, want float64) {
		k.t.Helper()
		if got < want*0.9 || got > want*1.1 {
			k.t.Fatalf("%s: fio read %.0f IOPS, want %.0f within 10%%", what, got, want)
		}
	}
	slow, free := iops("/limited"), iops("/unlimited")
	within("claim of class slow (1,000 IOPS)", slow, 1000)
	if free < 3*1000 {
		k.t.Fatalf("the claim without a class read %.0f IOPS beside one limited to 1,000: it is held too", free)
	}
	cgroupSays := func() string {
		k.t.Helper()
		return podCgroupLimit(k, "fio", volumeHandle(k, "limited"))
	}
	setClass := func(class string) {
		k.must("patch", "pvc", "limited", "-n", ns, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"volumeAttributesClassName":%q}}`, class))
	}
	setClass("hostpath-e2e-fast")
	k.waitFor("claim limited in class fast", 120*time.Second, func() (bool, string) {
		c := k.jsonpath(ns, "pvc/limited", "{.status.currentVolumeAttributesClassName}")
		return c == "hostpath-e2e-fast", c + " " + k.jsonpath(ns, "pvc/limited", "{.status.modifyVolumeStatus}")
	})
	fast := iops("/limited")
	within("the claim moved to class fast (10,000 IOPS) while its pod runs", fast, 10000)
	setClass("hostpath-e2e-bad")
	k.waitFor("claim limited's change to class bad refused", 120*time.Second, func() (bool, string) {
		s := k.jsonpath(ns, "pvc/limited", "{.status.modifyVolumeStatus.status}")
		return s == "Infeasible", s + " " + k.jsonpath(ns, "pvc/limited", "{.status.conditions}")
	})
	if c := k.jsonpath(ns, "pvc/limited", "{.status.currentVolumeAttributesClassName}"); c != "hostpath-e2e-fast" {
		k.t.Fatalf("after a refused change the claim's class in force is %q, want hostpath-e2e-fast", c)
	}
	var events string
	k.waitFor("the refusal's event", 60*time.Second, func() (bool, string) {
		events, _ = k.run("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=limited", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(events, "positive integer"), events
	})
	if got := cgroupSays(); got != "10000" {
		k.t.Fatalf("the pod's cgroups say %s after a refused change, want the limit in force, 10000", got)
	}
	fmt.Printf("e2e      fio 4 KiB random reads: %.0f IOPS in class slow (1,000), %.0f after the change to fast (10,000) with the pod running, %.0f on a claim without limits; class bad refused, 10000 kept\n", slow, fast, free)
	k.must("delete", "pod", "fio", "-n", ns, "--wait=false")
}

// podCgroupLimit is the read IOPS limit the cgroups of a pod's
// containers hold for the loop device of volume handle (cgroup v1's
// blkio.throttle.read_iops_device, as on the test cluster's nodes): the
// value, "" for none, or "mixed: ..." when they differ.
func podCgroupLimit(k *kube, pod, handle string) string {
	k.t.Helper()
	uid := k.jsonpath(ns, "pod/"+pod, "{.metadata.uid}")
	var dir string
	filepath.WalkDir("/sys/fs/cgroup/blkio", func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "pod"+uid {
			dir = p
			return filepath.SkipAll
		}
		return nil
	})
	if dir == "" {
		k.t.Fatalf("no cgroup of pod %s (%s) under /sys/fs/cgroup/blkio", pod, uid)
	}
	dev := loopOf(k, handle)
	seen := map[string]bool{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == dir {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "blkio.throttle.read_iops_device"))
		v := ""
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == dev {
				v = f[1]
			}
		}
		seen[v] = true
		return nil
	})
	if len(seen) != 1 {
		return fmt.Sprintf("mixed: %v", seen)
	}
	for v := range seen {
		return v
	}
	return ""
}

// loopOf is the major:minor of the loop device an image volume's image
// is attached to on this node.
func loopOf(k *kube, handle string) string {
	k.t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range files {
		b, _ := os.ReadFile(bf)
		if strings.Contains(string(b), handle+".img") {
			dev, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(bf)), "dev"))
			if err != nil {
				k.t.Fatal(err)
			}
			return strings.TrimSpace(string(dev))
		}
	}
	k.t.Fatalf("no loop device holds volume %s's image", handle)
	return ""
}
