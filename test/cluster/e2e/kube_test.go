package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kube runs kubectl against the test cluster.
type kube struct {
	t          *testing.T
	bin, cfg   string
	namespaces []string
}

// newKube is kubectl with the local cluster's admin kubeconfig.
func newKube(t *testing.T, cache string) *kube {
	return &kube{t: t, bin: filepath.Join(cache, "bin", "kubectl"), cfg: filepath.Join(cache, "cluster", "admin.kubeconfig")}
}

// waitRegistered waits until the driver is registered with kubelet (its
// CSINode entry) on every node.
func (k *kube) waitRegistered(nodes []string) {
	k.t.Helper()
	for _, n := range nodes {
		k.waitFor("CSINode driver on "+n, 60*time.Second, func() (bool, string) {
			d := k.jsonpath("", "csinode/"+n, "{.spec.drivers[*].name}")
			return strings.Contains(d, "hostpath.csi.k8s.io"), d
		})
	}
}

func (k *kube) run(stdin string, args ...string) (string, error) {
	cmd := exec.Command(k.bin, append([]string{"--kubeconfig", k.cfg}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// must runs kubectl and fails the test on an error.
func (k *kube) must(args ...string) string {
	k.t.Helper()
	out, err := k.run("", args...)
	if err != nil {
		k.t.Fatal(err)
	}
	return out
}

// apply applies a manifest given as text.
func (k *kube) apply(manifest string) {
	k.t.Helper()
	if _, err := k.run(manifest, "apply", "-f", "-"); err != nil {
		k.t.Fatal(err)
	}
}

// jsonpath reads one field of an object.
func (k *kube) jsonpath(ns, obj, path string) string {
	k.t.Helper()
	args := []string{"get", obj, "-o", "jsonpath=" + path}
	if ns != "" {
		args = append(args, "-n", ns)
	}
	out, err := k.run("", args...)
	if err != nil {
		return ""
	}
	return out
}

// waitFor polls cond until it is true or the timeout passes.
func (k *kube) waitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	k.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			k.t.Fatalf("%s: not done after %v (last: %s)", what, timeout, last)
		}
		time.Sleep(time.Second)
	}
}

// waitPod waits for a pod to reach a phase (Running or Succeeded).
func (k *kube) waitPod(ns, name, phase string, timeout time.Duration) {
	k.t.Helper()
	k.waitFor("pod "+name+" "+phase, timeout, func() (bool, string) {
		p := k.jsonpath(ns, "pod/"+name, "{.status.phase}")
		if p == "Failed" {
			k.t.Fatalf("pod %s failed: %s", name, k.describe(ns, "pod/"+name))
		}
		return p == phase, p + " " + k.jsonpath(ns, "pod/"+name, "{.status.containerStatuses[*].state}")
	})
}

// exec runs a command in a pod's container.
func (k *kube) exec(ns, pod string, cmd ...string) string {
	k.t.Helper()
	return k.must(append([]string{"exec", "-n", ns, pod, "--"}, cmd...)...)
}

func (k *kube) describe(ns, obj string) string {
	out, _ := k.run("", "describe", "-n", ns, obj)
	return out
}

// events returns a namespace's events, for failure messages.
func (k *kube) events(ns string) string {
	out, _ := k.run("", "get", "events", "-n", ns, "--sort-by=.lastTimestamp")
	return out
}

// leftIn says what holds a namespace that does not go away: the objects
// left in it with their finalizers and conditions, and the last lines of
// the sidecars that remove those finalizers.
func (k *kube) leftIn(ns string) string {
	var b strings.Builder
	kinds := "pods,pvc,volumesnapshots,volumegroupsnapshots"
	out, _ := k.run("", "get", kinds, "-n", ns, "-o",
		`jsonpath={range .items[*]}{.kind}/{.metadata.name} finalizers={.metadata.finalizers} deleting={.metadata.deletionTimestamp} status={.status}{"\n"}{end}`)
	fmt.Fprintf(&b, "left in %s:\n%s", ns, out)
	out, _ = k.run("", "get", "volumesnapshotcontents,volumegroupsnapshotcontents", "-o",
		`jsonpath={range .items[*]}{.kind}/{.metadata.name} finalizers={.metadata.finalizers} deleting={.metadata.deletionTimestamp} status={.status}{"\n"}{end}`)
	fmt.Fprintf(&b, "contents:\n%s", out)
	b.WriteString(k.events(ns))
	for _, c := range []string{"-n hostpath-csi -l app=hostpath-csi-controller -c csi-snapshotter",
		"-n hostpath-csi -l app=hostpath-csi-controller -c hostpath",
		"-n kube-system -l app.kubernetes.io/name=snapshot-controller"} {
		out, _ = k.run("", append([]string{"logs", "--prefix", "--tail=40"}, strings.Fields(c)...)...)
		fmt.Fprintf(&b, "logs %s:\n%s", c, out)
	}
	return b.String()
}

// items decodes "kubectl get -o json" of a list.
func (k *kube) items(args ...string) []map[string]any {
	k.t.Helper()
	out := k.must(append([]string{"get", "-o", "json"}, args...)...)
	var list struct{ Items []map[string]any }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		k.t.Fatal(err)
	}
	return list.Items
}

// step times one stage of the test and prints it, as the issue asks.
func step(t *testing.T, name string, f func()) {
	t.Helper()
	start := time.Now()
	f()
	fmt.Printf("e2e step %-58s %6.1fs\n", name, time.Since(start).Seconds())
}

// moduleDir finds a module's source in the module cache (downloading it
// if needed), for manifests the projects ship (CRDs, snapshot-controller).
func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", mod).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", mod, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %s", mod, out)
	}
	return m.Dir
}

// imageRef reads the image name an OCI archive from ociimage carries.
func imageRef(t *testing.T, archive string) string {
	t.Helper()
	out, err := exec.Command("tar", "-xOf", archive, "index.json").Output()
	if err != nil {
		t.Fatalf("reading %s: %v", archive, err)
	}
	var idx struct {
		Manifests []struct{ Annotations map[string]string }
	}
	if err := json.Unmarshal(out, &idx); err != nil || len(idx.Manifests) == 0 {
		t.Fatalf("index.json of %s: %v", archive, err)
	}
	return idx.Manifests[0].Annotations["io.containerd.image.name"]
}

func cacheDir() string {
	if v := os.Getenv("CACHE"); v != "" {
		return v
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "hostpath-csi")
}
