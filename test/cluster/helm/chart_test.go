// Package helm checks the Helm chart (charts/hostpath-csi) against deploy/:
// with its default values the chart renders the same objects as
// kubectl apply -k deploy/, but the Namespace, which helm install
// --create-namespace makes. The helm binary is the one this module builds
// (make helm); HELM names it.
package helm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const namespace = "hostpath-csi"

// clusterScoped are the kinds of deploy/ that have no namespace.
var clusterScoped = map[string]bool{"Namespace": true, "CSIDriver": true, "StorageClass": true, "VolumeSnapshotClass": true, "VolumeGroupSnapshotClass": true, "ClusterRole": true, "ClusterRoleBinding": true}

func repo(t *testing.T) string {
	r, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func helmBin(t *testing.T) string {
	h := os.Getenv("HELM")
	if h == "" {
		t.Fatal("HELM is not set: run make test (it builds helm from this module and sets it)")
	}
	return h
}

// objects decodes a multi-document YAML stream into objects keyed by
// kind/namespace/name, dropping comments and empty documents.
func objects(t *testing.T, stream []byte) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, doc := range bytes.Split(stream, []byte("\n---")) {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("decoding %q: %v", doc, err)
		}
		if len(o) == 0 {
			continue
		}
		meta, _ := o["metadata"].(map[string]any)
		if clusterScoped[fmt.Sprint(o["kind"])] {
			// kustomize's namespace: field marks kinds it does not know
			// (VolumeSnapshotClass) too; the API server ignores it.
			delete(meta, "namespace")
		}
		key := fmt.Sprintf("%v/%v/%v", o["kind"], meta["namespace"], meta["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice", key)
		}
		out[key] = o
	}
	return out
}

func render(t *testing.T, args ...string) map[string]map[string]any {
	t.Helper()
	cmd := exec.Command(helmBin(t), append([]string{"template", "hostpath-csi", filepath.Join(repo(t), "charts", "hostpath-csi"), "--namespace", namespace}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr.String())
	}
	return objects(t, out)
}

// TestChartRendersDeploy: the chart's defaults are deploy/.
func TestChartRendersDeploy(t *testing.T) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(repo(t), "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	y, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	want := objects(t, y)
	delete(want, "Namespace/<nil>/"+namespace)
	if len(want) < 10 {
		t.Fatalf("deploy/ gave only %d objects", len(want))
	}
	got := render(t)
	var keys []string
	for key := range want {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		g, ok := got[key]
		if !ok {
			t.Errorf("deploy/ has %s, the chart does not", key)
			continue
		}
		if !reflect.DeepEqual(normal(g), normal(want[key])) {
			gj, _ := json.MarshalIndent(g, "", " ")
			wj, _ := json.MarshalIndent(want[key], "", " ")
			t.Errorf("%s differs:\nchart:\n%s\ndeploy/:\n%s", key, gj, wj)
		}
		delete(got, key)
	}
	for key := range got {
		t.Errorf("the chart renders %s, deploy/ does not", key)
	}
	t.Logf("%d objects alike (deploy/'s Namespace left to helm install --create-namespace)", len(keys))
}

// normal drops what differs only in spelling: a container's image policy
// left to the default.
func normal(o map[string]any) any {
	b, _ := json.Marshal(o)
	var v any
	json.Unmarshal(b, &v)
	return v
}

// TestChartValues: the values users set reach the objects.
func TestChartValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the rendered DaemonSet or classes, as JSON
		fail string
	}{
		{"image and log level", []string{"--set", "image.tag=v9.9.9", "--set", "logLevel=5"},
			[]string{`"ghcr.io/hostpath-csi/hostpathplugin:v9.9.9"`, `"-v=5"`, `"--v=5"`}, ""},
		{"two pools", []string{"--set-json", `pools=[{"name":"nvme","path":"/var/lib/csi-hostpath-pools/nvme","storageClass":"fast"},{"name":"hdd","path":"/var/lib/csi-hostpath-pools/hdd"}]`},
			[]string{`"--pool=nvme=/var/lib/csi-hostpath-pools/nvme"`, `"--pool=hdd=/var/lib/csi-hostpath-pools/hdd"`, `"pool":"nvme"`}, ""},
		{"a pool outside poolsHostDir", []string{"--set-json", `pools=[{"name":"x","path":"/mnt/x"}]`}, nil, "not under poolsHostDir"},
		{"node selector, tolerations, resources", []string{"--set", "nodeSelector.disk=nvme", "--set-json", `tolerations=[{"operator":"Exists"}]`, "--set", "resources.limits.memory=1Gi"},
			[]string{`"nodeSelector":{"disk":"nvme"}`, `"tolerations":[{"operator":"Exists"}]`, `"memory":"1Gi"`}, ""},
		{"sidecar versions", []string{"--set", "sidecars.provisioner.tag=v9.0.0"}, []string{`"registry.k8s.io/sig-storage/csi-provisioner:v9.0.0"`}, ""},
		{"metrics port", []string{"--set", "metrics.port=9999"}, []string{`"--http-endpoint=:9999"`, `"containerPort":9999`}, ""},
		{"transfer port", []string{"--set", "transfer.port=9999"}, []string{`"--transfer-endpoint=:9999"`, `"hostPort":9999`, `"port":9999`}, ""},
		{"control port and controller replicas", []string{"--set", "control.port=9998", "--set", "controller.replicas=3"}, []string{`"--control-endpoint=:9998"`, `"hostPort":9998`, `"port":9998`, `"replicas":3`}, ""},
		{"release namespace in the admission policies", []string{"--namespace", "storage"}, []string{`system:serviceaccount:storage:hostpath-csi-node`}, ""},
		{"snapshot class", []string{"--set", "snapshotClass.parameters.compression=zstd"}, []string{`"compression":"zstd"`}, ""},
		{"no classes", []string{"--set", "storageClass.create=false", "--set", "imageStorageClass.create=false", "--set", "xfsImageStorageClass.create=false", "--set", "directoryStorageClass.create=false", "--set", "snapshotClass.create=false", "--set", "pools=null"}, nil, ""},
		{"image class", []string{"--set", "imageStorageClass.name=db"}, []string{`"name":"db"`, `"layout":"image"`}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(helmBin(t), append([]string{"template", "hostpath-csi", filepath.Join(repo(t), "charts", "hostpath-csi"), "--namespace", namespace}, tc.args...)...)
			out, err := cmd.CombinedOutput()
			if tc.fail != "" {
				if err == nil || !strings.Contains(string(out), tc.fail) {
					t.Fatalf("helm template: %v %s, want a failure saying %q", err, out, tc.fail)
				}
				return
			}
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			objs := objects(t, out)
			all, _ := json.Marshal(objs)
			for _, w := range tc.want {
				if !strings.Contains(string(all), w) {
					t.Errorf("rendered objects lack %s", w)
				}
			}
			if tc.name == "no classes" {
				for key := range objs {
					if strings.HasPrefix(key, "StorageClass/") || strings.HasPrefix(key, "VolumeSnapshotClass/") {
						t.Errorf("%s rendered with the classes turned off", key)
					}
				}
			}
		})
	}
}
