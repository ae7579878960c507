package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// asController is a kubeconfig with a token of the controller's service
// account: what root on a node that runs a controller replica can take.
func asController(t *testing.T, k *kube) string {
	t.Helper()
	token := strings.TrimSpace(k.must("create", "token", "hostpath-csi-controller", "-n", driverNS, "--duration=10m"))
	server := k.must("config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	ca := k.must("config", "view", "--raw", "--minify", "-o", "jsonpath={.clusters[0].cluster.certificate-authority-data}")
	cfg := filepath.Join(t.TempDir(), "controller.kubeconfig")
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, certificate-authority-data: %q}}]\nusers: [{name: u, user: {token: %q}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n", server, ca, token)
	if err := os.WriteFile(cfg, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// controllerAttempts: the controller's account is kept by its admission
// policy to this driver's PersistentVolumes and snapshot contents, and on
// a volume to what the resizer changes: dry runs of what a taken
// controller token would do are refused, and the resizer's own change
// (a capacity) is not. pv is a PersistentVolume of this driver.
func controllerAttempts(t *testing.T, k *kube, pv string) {
	step(t, "the admission policy keeps the controller's account to this driver's objects", func() {
		taken := &kube{t: t, bin: k.bin, cfg: asController(t, k)}
		// Another driver's volume and snapshot content, made by the
		// cluster's admin.
		k.apply(`apiVersion: v1
kind: PersistentVolume
metadata: {name: e2e-other-driver}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  csi: {driver: other.csi.example.com, volumeHandle: other-1}
`)
		defer k.run("", "delete", "pv", "e2e-other-driver", "--ignore-not-found")
		k.apply(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata: {name: e2e-other-content}
spec:
  driver: other.csi.example.com
  deletionPolicy: Retain
  source: {snapshotHandle: other-snap-1}
  volumeSnapshotRef: {namespace: default, name: nothing}
`)
		defer k.run("", "delete", "volumesnapshotcontent", "e2e-other-content", "--ignore-not-found")
		reclaim := "Delete"
		if k.jsonpath("", "pv/"+pv, "{.spec.persistentVolumeReclaimPolicy}") == "Delete" {
			reclaim = "Retain"
		}
		for _, c := range []struct {
			what, says string
			args       []string
		}{
			{"grow another driver's volume", "only this driver's", []string{"patch", "pv", "e2e-other-driver", "--type=merge", "-p", `{"spec":{"capacity":{"storage":"2Gi"}}}`}},
			{"label another driver's snapshot content", "only this driver's", []string{"label", "volumesnapshotcontent", "e2e-other-content", "e2e.hostpath.csi/taken=1"}},
			{"change the reclaim policy of a volume of this driver to " + reclaim, "capacity and volume attributes class only", []string{"patch", "pv", pv, "--type=merge", "-p", `{"spec":{"persistentVolumeReclaimPolicy":"` + reclaim + `"}}`}},
			{"release a volume of this driver from its claim", "capacity and volume attributes class only", []string{"patch", "pv", pv, "--type=merge", "-p", `{"spec":{"claimRef":null}}`}},
		} {
			_, err := taken.run("", append(c.args, "--dry-run=server")...)
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("the controller's account tried to %s: %v, want a refusal saying %q", c.what, err, c.says)
			}
			fmt.Printf("e2e      the controller's account tried to %s: refused (%s)\n", c.what, c.says)
		}
		capacity := k.jsonpath("", "pv/"+pv, "{.spec.capacity.storage}")
		if _, err := taken.run("", "patch", "pv", pv, "--type=merge", "-p", `{"spec":{"capacity":{"storage":"`+capacity+`"}}}`, "--dry-run=server"); err != nil {
			t.Fatalf("the controller's account setting a volume's capacity, as the resizer does: %v", err)
		}
		fmt.Println("e2e      the controller's account may still set a volume's capacity (the resizer's change)")
	})
}
