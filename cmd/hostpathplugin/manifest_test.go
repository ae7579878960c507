package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	groupv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumegroupsnapshot/v1"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/yaml"

	"github.com/hostpath-csi/hostpath/csi"
)

// manifests holds every object of deploy/, decoded strictly: a field the
// Kubernetes types do not have (a typo, a wrong indentation) fails.
type manifests struct {
	daemonSets  []appsv1.DaemonSet
	deployments []appsv1.Deployment
	// groupClasses are the VolumeGroupSnapshotClasses.
	groupClasses []groupv1.VolumeGroupSnapshotClass
	// roleRules are each Role's and ClusterRole's rules, by kind/name;
	// roleBindings each binding's role (kind/name) by the service
	// accounts it binds (namespace/name).
	roleRules     map[string][]rbacv1.PolicyRule
	roleBindings  map[string][]string
	accounts      map[string]bool
	roles         map[string]bool
	rules         []rbacv1.PolicyRule // of the Roles (namespaced)
	bindings      []rbacv1.RoleRef
	subjects      []rbacv1.Subject
	drivers       []storagev1.CSIDriver
	classes       []storagev1.StorageClass
	snapClasses   []snapv1.VolumeSnapshotClass
	policies      []admissionv1.ValidatingAdmissionPolicy
	policyBinds   []admissionv1.ValidatingAdmissionPolicyBinding
	netPolicies   []networkingv1.NetworkPolicy
	pods          []corev1.Pod
	pvcs          []corev1.PersistentVolumeClaim
	snapshots     []snapv1.VolumeSnapshot
	kustomization map[string][]string
}

func load(t *testing.T) manifests {
	t.Helper()
	m := manifests{accounts: map[string]bool{}, roles: map[string]bool{}, kustomization: map[string][]string{},
		roleRules: map[string][]rbacv1.PolicyRule{}, roleBindings: map[string][]string{}}
	files, _ := filepath.Glob("../../deploy/*.yaml")
	more, _ := filepath.Glob("../../deploy/example/*.yaml")
	for _, f := range append(files, more...) {
		if isTestDriver(f) {
			continue // not an object: TestE2EDriverDefinition checks it
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			var head struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			strict := func(into any) {
				if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
					t.Fatalf("%s (%s): %v", f, head.Kind, err)
				}
			}
			switch head.Kind {
			case "Kustomization":
				var k struct {
					APIVersion string              `json:"apiVersion"`
					Kind       string              `json:"kind"`
					Namespace  string              `json:"namespace"`
					Resources  []string            `json:"resources"`
					Images     []map[string]string `json:"images"`
				}
				strict(&k)
				m.kustomization[filepath.Dir(f)] = k.Resources
			case "Namespace":
				strict(&corev1.Namespace{})
			case "ServiceAccount":
				var sa corev1.ServiceAccount
				strict(&sa)
				m.accounts[sa.Namespace+"/"+sa.Name] = true
			case "ClusterRole", "Role":
				var r rbacv1.ClusterRole
				strict(&r)
				m.roles[head.Kind+"/"+r.Name] = true
				m.roleRules[head.Kind+"/"+r.Name] = r.Rules
				if head.Kind == "Role" {
					m.rules = append(m.rules, r.Rules...)
				}
			case "ClusterRoleBinding", "RoleBinding":
				var b rbacv1.ClusterRoleBinding
				strict(&b)
				m.bindings = append(m.bindings, b.RoleRef)
				m.subjects = append(m.subjects, b.Subjects...)
				for _, sub := range b.Subjects {
					key := sub.Namespace + "/" + sub.Name
					m.roleBindings[key] = append(m.roleBindings[key], b.RoleRef.Kind+"/"+b.RoleRef.Name)
				}
			case "ValidatingAdmissionPolicy":
				var p admissionv1.ValidatingAdmissionPolicy
				strict(&p)
				m.policies = append(m.policies, p)
			case "ValidatingAdmissionPolicyBinding":
				var b admissionv1.ValidatingAdmissionPolicyBinding
				strict(&b)
				m.policyBinds = append(m.policyBinds, b)
			case "NetworkPolicy":
				var np networkingv1.NetworkPolicy
				strict(&np)
				m.netPolicies = append(m.netPolicies, np)
			case "Deployment":
				var d appsv1.Deployment
				strict(&d)
				m.deployments = append(m.deployments, d)
			case "DaemonSet":
				var ds appsv1.DaemonSet
				strict(&ds)
				m.daemonSets = append(m.daemonSets, ds)
			case "CSIDriver":
				var d storagev1.CSIDriver
				strict(&d)
				m.drivers = append(m.drivers, d)
			case "StorageClass":
				var c storagev1.StorageClass
				strict(&c)
				m.classes = append(m.classes, c)
			case "VolumeSnapshotClass":
				var c snapv1.VolumeSnapshotClass
				strict(&c)
				m.snapClasses = append(m.snapClasses, c)
			case "VolumeGroupSnapshotClass":
				var c groupv1.VolumeGroupSnapshotClass
				strict(&c)
				m.groupClasses = append(m.groupClasses, c)
			case "VolumeSnapshot":
				var s snapv1.VolumeSnapshot
				strict(&s)
				m.snapshots = append(m.snapshots, s)
			case "Pod":
				var p corev1.Pod
				strict(&p)
				m.pods = append(m.pods, p)
			case "PersistentVolumeClaim":
				var c corev1.PersistentVolumeClaim
				strict(&c)
				m.pvcs = append(m.pvcs, c)
			default:
				t.Fatalf("%s: no check for kind %q", f, head.Kind)
			}
		}
	}
	return m
}

var envRef = regexp.MustCompile(`\$\(([A-Z_]+)\)`)

// flagValue returns --name=value from args.
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func TestManifests(t *testing.T) {
	m := load(t)
	// Every file is listed in its kustomization.
	for dir, res := range m.kustomization {
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, f := range files {
			if base := filepath.Base(f); base != "kustomization.yaml" && !isTestDriver(base) && !contains(res, base) {
				t.Errorf("%s is not listed in %s/kustomization.yaml", base, dir)
			}
		}
	}
	if len(m.drivers) != 1 || len(m.daemonSets) != 1 {
		t.Fatalf("want one CSIDriver and one DaemonSet, got %d and %d", len(m.drivers), len(m.daemonSets))
	}
	drv := m.drivers[0]
	if drv.Spec.FSGroupPolicy == nil || *drv.Spec.FSGroupPolicy != storagev1.FileFSGroupPolicy || drv.Spec.StorageCapacity == nil || !*drv.Spec.StorageCapacity {
		t.Error("CSIDriver needs fsGroupPolicy File and storageCapacity")
	}
	ds := m.daemonSets[0]
	spec := ds.Spec.Template.Spec
	if !m.accounts[ds.Namespace+"/"+spec.ServiceAccountName] {
		t.Errorf("DaemonSet uses service account %q, which deploy/ does not create", spec.ServiceAccountName)
	}
	for _, r := range m.bindings {
		if !m.roles[r.Kind+"/"+r.Name] {
			t.Errorf("a binding refers to %s %q, which deploy/ does not create", r.Kind, r.Name)
		}
	}
	for _, s := range m.subjects {
		if !m.accounts[s.Namespace+"/"+s.Name] {
			t.Errorf("a binding names service account %s/%s, which deploy/ does not create", s.Namespace, s.Name)
		}
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	var driver *corev1.Container
	for i, c := range spec.Containers {
		if c.Name == "hostpath" {
			driver = &spec.Containers[i]
		}
	}
	if driver == nil {
		t.Fatal("no driver container")
	}
	// The driver's own flag parsing accepts the args, with the env
	// references kubelet would expand.
	var args []string
	for _, a := range driver.Args {
		args = append(args, envRef.ReplaceAllString(a, "node-1"))
	}
	o, err := parseFlags(args)
	if err != nil {
		t.Fatalf("the driver refuses the DaemonSet's args: %v", err)
	}
	checkTransferRBAC(t, m, ds.Namespace+"/"+spec.ServiceAccountName, o)
	for _, c := range m.classes {
		if c.Provisioner != o.cfg.DriverName || c.VolumeBindingMode == nil || *c.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer {
			t.Errorf("StorageClass %s: provisioner %q (want %q), binding mode must be WaitForFirstConsumer", c.Name, c.Provisioner, o.cfg.DriverName)
		}
	}
	for _, c := range m.snapClasses {
		if c.Driver != o.cfg.DriverName {
			t.Errorf("VolumeSnapshotClass %s names driver %q", c.Name, c.Driver)
		}
	}
	if len(m.groupClasses) != 1 || m.groupClasses[0].Driver != o.cfg.DriverName {
		t.Errorf("want one VolumeGroupSnapshotClass of driver %s: %+v", o.cfg.DriverName, m.groupClasses)
	}
	if drv.Name != o.cfg.DriverName {
		t.Errorf("CSIDriver %q, driver runs as %q", drv.Name, o.cfg.DriverName)
	}
	// Sockets: where the driver listens is where the sidecars dial, on the
	// same volume, and what kubelet is told is that volume's host path.
	sock := strings.TrimPrefix(o.cfg.Endpoint, "unix://")
	sockVol := volumeAt(t, driver, filepath.Dir(sock))
	want := filepath.Join(hostPaths[sockVol], filepath.Base(sock))
	if o.kubeletRegistrationPath != want {
		t.Errorf("--kubelet-registration-path %q, but the socket is at %q on the host", o.kubeletRegistrationPath, want)
	}
	if hostPaths[volumeAt(t, driver, o.pluginRegistrationPath)] != "/var/lib/kubelet/plugins_registry" {
		t.Error("--plugin-registration-path is not kubelet's plugins_registry")
	}
	for _, c := range spec.Containers {
		if c.Name == "hostpath" {
			continue
		}
		addr := flagValue(c.Args, "csi-address")
		if addr != sock || volumeAt(t, &c, filepath.Dir(addr)) != sockVol {
			t.Errorf("sidecar %s dials %q, the driver listens on %q (volume %s)", c.Name, addr, sock, sockVol)
		}
	}
	// Mounts the driver makes must reach kubelet and the pods.
	for _, mnt := range driver.VolumeMounts {
		if strings.HasPrefix(mnt.MountPath, "/var/lib/kubelet/p") && (mnt.MountPropagation == nil || *mnt.MountPropagation != corev1.MountPropagationBidirectional) {
			t.Errorf("%s needs mountPropagation Bidirectional", mnt.MountPath)
		}
	}
	if driver.SecurityContext == nil || driver.SecurityContext.Privileged == nil || !*driver.SecurityContext.Privileged {
		t.Error("the driver container must be privileged (mount, loop devices)")
	}
	if p := driver.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || !strings.HasSuffix(o.httpEndpoint, ":9808") {
		t.Error("liveness probe must hit /healthz on the --http-endpoint port")
	}
	// The examples use the class and driver deploy/ defines.
	for _, p := range m.pods {
		for _, v := range p.Spec.Volumes {
			if v.CSI != nil && v.CSI.Driver != o.cfg.DriverName {
				t.Errorf("pod %s: inline volume of driver %q", p.Name, v.CSI.Driver)
			}
		}
	}
	for _, c := range m.pvcs {
		if c.Spec.StorageClassName == nil || *c.Spec.StorageClassName != m.classes[0].Name {
			t.Errorf("PVC %s does not use StorageClass %s", c.Name, m.classes[0].Name)
		}
	}
	for _, s := range m.snapshots {
		if s.Spec.VolumeSnapshotClassName == nil || *s.Spec.VolumeSnapshotClassName != m.snapClasses[0].Name {
			t.Errorf("VolumeSnapshot %s does not use class %s", s.Name, m.snapClasses[0].Name)
		}
	}
}

// volumeAt names the volume mounted at path in the container.
func volumeAt(t *testing.T, c *corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return m.Name
		}
	}
	t.Errorf("container %s mounts nothing at %s", c.Name, path)
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// isTestDriver reports whether a deploy/ file is a claim to the e2e suite.
func isTestDriver(f string) bool {
	ok, _ := filepath.Match("test-driver*.yaml", filepath.Base(f))
	return ok
}

// deploy/test-driver*.yaml tell the Kubernetes e2e suite what the driver
// does (test-driver.yaml of deploy/'s default class, ext4 image volumes;
// test-driver-image-xfs.yaml of XFS image volumes;
// test-driver-directory.yaml of directory volumes; test-driver-group.yaml
// of the group snapshot spec on several nodes, its class from a file);
// each must name this driver, its topology key and classes deploy/
// creates (or a class of this driver), and only capabilities the suite
// knows.
func TestE2EDriverDefinition(t *testing.T) {
	files, _ := filepath.Glob("../../deploy/test-driver*.yaml")
	if len(files) != 4 {
		t.Fatalf("claims to the e2e suite: %v, want test-driver.yaml, test-driver-image-xfs.yaml, test-driver-directory.yaml and test-driver-group.yaml", files)
	}
	want := map[string]string{"test-driver.yaml": "hostpath", "test-driver-image-xfs.yaml": "hostpath-image-xfs", "test-driver-directory.yaml": "hostpath-directory", "test-driver-group.yaml": ""}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { checkE2EDriver(t, f, want[filepath.Base(f)]) })
	}
}

func checkE2EDriver(t *testing.T, file, class string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var def struct {
		StorageClass       struct{ FromExistingClassName, FromFile string }
		SnapshotClass      struct{ FromExistingClassName string }
		GroupSnapshotClass struct{ FromExistingClassName string }
		DriverInfo         struct {
			Name               string
			SupportedSizeRange struct{ Min, Max string }
			TopologyKeys       []string
			Capabilities       map[string]bool
		}
		InlineVolumes []struct{ Attributes map[string]string }
	}
	if err := yaml.UnmarshalStrict(data, &def); err != nil {
		t.Fatal(err)
	}
	m := load(t)
	if def.DriverInfo.Name != m.drivers[0].Name {
		t.Errorf("test driver %q, CSIDriver %q", def.DriverInfo.Name, m.drivers[0].Name)
	}
	if len(def.DriverInfo.TopologyKeys) != 1 || def.DriverInfo.TopologyKeys[0] != csi.TopologyKey {
		t.Errorf("topology keys %v, the driver's is %s", def.DriverInfo.TopologyKeys, csi.TopologyKey)
	}
	var classes []string
	for _, c := range m.classes {
		classes = append(classes, c.Name)
	}
	if f := def.StorageClass.FromFile; f != "" {
		// Read relative to the repository (make e2e-suite's -repo-root).
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		var sc storagev1.StorageClass
		if err := yaml.UnmarshalStrict(b, &sc); err != nil {
			t.Fatal(err)
		}
		if sc.Kind != "StorageClass" || sc.Provisioner != m.drivers[0].Name {
			t.Errorf("%s is a %s of %q, want a StorageClass of %s", f, sc.Kind, sc.Provisioner, m.drivers[0].Name)
		}
	} else if got := def.StorageClass.FromExistingClassName; got != class || !contains(classes, got) {
		t.Errorf("class %q: want %q, one of deploy/'s %v", got, class, classes)
	}
	if def.SnapshotClass.FromExistingClassName != m.snapClasses[0].Name {
		t.Errorf("snapshot class %q is not deploy/'s", def.SnapshotClass.FromExistingClassName)
	}
	if def.DriverInfo.Capabilities["groupSnapshot"] && def.GroupSnapshotClass.FromExistingClassName != m.groupClasses[0].Name {
		t.Errorf("group snapshot class %q is not deploy/'s", def.GroupSnapshotClass.FromExistingClassName)
	}
	known := []string{"persistence", "block", "fsGroup", "exec", "snapshotDataSource", "pvcDataSource", "multipods",
		"controllerExpansion", "nodeExpansion", "offlineExpansion", "onlineExpansion", "singleNodeVolume", "topology", "capacity",
		"FSResizeFromSourceNotSupported", "groupSnapshot"}
	for c := range def.DriverInfo.Capabilities {
		if !contains(known, c) {
			t.Errorf("capability %q is not one this driver has been shown to have", c)
		}
	}
	for _, v := range def.InlineVolumes {
		for k := range v.Attributes {
			if k != "size" {
				t.Errorf("inline volume attribute %q is not one the driver takes", k)
			}
		}
	}
}

// may reports whether the service account may do verb on resource
// (named name, or any when name is "") through the roles bound to it.
func (m manifests) may(account, verb, group, resource, name string) bool {
	for _, role := range m.roleBindings[account] {
		for _, r := range m.roleRules[role] {
			if !contains(r.Verbs, verb) || !contains(r.APIGroups, group) || !contains(r.Resources, resource) {
				continue
			}
			if len(r.ResourceNames) == 0 || (name != "" && contains(r.ResourceNames, name)) {
				return true
			}
		}
	}
	return false
}

// checkTransferRBAC: the nodes may ask for certificates and read the
// authorities to trust, and read no Secret; the transfer signer's
// Deployment takes its flags, and may do what it needs with the names
// its flags and the driver's give, and the drivers' requests name the
// service account it grants.
func checkTransferRBAC(t *testing.T, m manifests, node string, o options) {
	t.Helper()
	for _, c := range []struct{ verb, group, resource, name string }{
		{"create", "certificates.k8s.io", "certificatesigningrequests", ""},
		{"get", "certificates.k8s.io", "certificatesigningrequests", "x"},
		{"get", "", "configmaps", o.transferTrust},
		{"get", "snapshot.storage.k8s.io", "volumesnapshots", "x"},
		{"get", "groupsnapshot.storage.k8s.io", "volumegroupsnapshots", "x"},
	} {
		if !m.may(node, c.verb, c.group, c.resource, c.name) {
			t.Errorf("the drivers may not %s %s %q", c.verb, c.resource, c.name)
		}
	}
	for _, verb := range []string{"get", "list", "update"} {
		if m.may(node, verb, "", "secrets", "hostpath-csi-transfer-signer") {
			t.Errorf("the drivers may %s a transfer authority's Secret: a node would hold a key that speaks for every other", verb)
		}
	}
	dep := m.deployment(t, "transfer-signer")
	spec := dep.Spec.Template.Spec
	signer := dep.Namespace + "/" + spec.ServiceAccountName
	if !m.accounts[signer] || signer == node {
		t.Fatalf("the signer runs as %s: a service account of its own that deploy/ creates", signer)
	}
	so, err := parseFlags(spec.Containers[0].Args)
	if err != nil || so.mode != "transfer-signer" {
		t.Fatalf("the signer's args: mode %q, %v", so.mode, err)
	}
	if so.cfg.DriverName != o.cfg.DriverName || so.transferTrust != o.transferTrust || dep.Namespace+"/"+so.signer.requester != node {
		t.Errorf("the signer grants %s for driver %s and publishes %s; the drivers are %s of %s reading %s",
			so.signer.requester, so.cfg.DriverName, so.transferTrust, node, o.cfg.DriverName, o.transferTrust)
	}
	for _, c := range []struct{ verb, group, resource, name string }{
		{"watch", "certificates.k8s.io", "certificatesigningrequests", ""},
		{"update", "certificates.k8s.io", "certificatesigningrequests/approval", "x"},
		{"update", "certificates.k8s.io", "certificatesigningrequests/status", "x"},
		{"delete", "certificates.k8s.io", "certificatesigningrequests", "x"},
		{"approve", "certificates.k8s.io", "signers", signerName(so.cfg.DriverName)},
		{"sign", "certificates.k8s.io", "signers", signerName(so.cfg.DriverName)},
		{"get", "", "secrets", so.signer.keySecret},
		{"update", "", "secrets", so.signer.keySecret},
		{"create", "", "secrets", ""},
		{"update", "", "configmaps", so.transferTrust},
		{"create", "", "configmaps", ""},
	} {
		if !m.may(signer, c.verb, c.group, c.resource, c.name) {
			t.Errorf("the signer may not %s %s %q", c.verb, c.resource, c.name)
		}
	}
	if m.may(signer, "approve", "certificates.k8s.io", "signers", "kubernetes.io/kube-apiserver-client") {
		t.Error("the signer may approve for other signers")
	}
	// It checks the pod a request's token is bound to.
	if !m.may(signer, "get", "", "pods", "driver-pod") {
		t.Error("the signer may not get the requester's pod")
	}
	for _, verb := range []string{"get", "update", "delete"} {
		if m.may(signer, verb, "", "secrets", "hostpath-csi-transfer-authority") {
			t.Errorf("the signer may still %s the shared Secret of the mode that was removed", verb)
		}
	}
}

// deployment is the one Deployment of deploy/ whose driver runs in mode.
func (m manifests) deployment(t *testing.T, mode string) appsv1.Deployment {
	t.Helper()
	var found []appsv1.Deployment
	for _, d := range m.deployments {
		if flagValue(d.Spec.Template.Spec.Containers[0].Args, "mode") == mode {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one Deployment of --mode=%s, got %d", mode, len(found))
	}
	return found[0]
}

// TestControllerDeployment: the controller takes its flags as the nodes'
// drivers set them (driver, trust, the control port each node exposes at
// its internal IP), runs the snapshotter and resizer in controller mode
// with leader election on its socket, as an account the signer grants
// the controller's certificate and that may do what the sidecars and the
// routing need and no more; no node runs a snapshotter or a resizer.
func TestControllerDeployment(t *testing.T) {
	m := load(t)
	ds := m.daemonSets[0]
	var node options
	for _, c := range ds.Spec.Template.Spec.Containers {
		switch c.Name {
		case "hostpath":
			var args []string
			for _, a := range c.Args {
				args = append(args, envRef.ReplaceAllString(a, "node-1"))
			}
			var err error
			if node, err = parseFlags(args); err != nil {
				t.Fatal(err)
			}
			_, port, _ := strings.Cut(node.controlEndpoint, ":")
			exposed := false
			for _, p := range c.Ports {
				exposed = exposed || (fmt.Sprint(p.HostPort) == port && fmt.Sprint(p.ContainerPort) == port)
			}
			if port == "" || !exposed {
				t.Errorf("the node's control endpoint %q is not a hostPort of its pod: the controller dials the node's internal IP", node.controlEndpoint)
			}
		case "csi-snapshotter", "csi-resizer":
			t.Errorf("the DaemonSet runs %s on every node; the controller runs it once", c.Name)
		}
	}
	dep := m.deployment(t, "controller")
	spec := dep.Spec.Template.Spec
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Error("the controller runs one replica: while it is rescheduled nothing is snapshotted")
	}
	o, err := parseFlags(spec.Containers[0].Args)
	if err != nil {
		t.Fatal(err)
	}
	if o.cfg.DriverName != node.cfg.DriverName || o.transferTrust != node.transferTrust || o.controlEndpoint != node.controlEndpoint {
		t.Errorf("the controller: driver %s, trust %s, control %s; the nodes: %s, %s, %s", o.cfg.DriverName, o.transferTrust, o.controlEndpoint, node.cfg.DriverName, node.transferTrust, node.controlEndpoint)
	}
	sock := strings.TrimPrefix(o.cfg.Endpoint, "unix://")
	sidecars := map[string]bool{}
	for _, c := range spec.Containers[1:] {
		sidecars[c.Name] = true
		if flagValue(c.Args, "csi-address") != sock {
			t.Errorf("%s dials %s, the controller listens on %s", c.Name, flagValue(c.Args, "csi-address"), sock)
		}
		if !slices.Contains(c.Args, "--leader-election") || slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--node-deployment") }) {
			t.Errorf("%s: %v, want leader election and no node deployment", c.Name, c.Args)
		}
	}
	if !sidecars["csi-snapshotter"] || !sidecars["csi-resizer"] {
		t.Errorf("the controller runs %v, want the snapshotter and the resizer", sidecars)
	}
	account := dep.Namespace + "/" + spec.ServiceAccountName
	signer := m.deployment(t, "transfer-signer")
	so, _ := parseFlags(signer.Spec.Template.Spec.Containers[0].Args)
	if dep.Namespace+"/"+so.signer.controller != account || account == dep.Namespace+"/"+ds.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("the controller runs as %s; the signer grants the controller's certificate to %s", account, so.signer.controller)
	}
	for _, c := range []struct{ verb, group, resource, name string }{
		{"create", "certificates.k8s.io", "certificatesigningrequests", ""},
		{"get", "", "configmaps", o.transferTrust},
		{"list", "storage.k8s.io", "csinodes", ""},
		{"get", "", "nodes", "node-1"},
		{"update", "coordination.k8s.io", "leases", "x"},
		{"update", "snapshot.storage.k8s.io", "volumesnapshotcontents/status", "x"},
		{"update", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "x"},
		{"patch", "", "persistentvolumes", "x"},
		{"patch", "", "persistentvolumeclaims/status", "x"},
	} {
		if !m.may(account, c.verb, c.group, c.resource, c.name) {
			t.Errorf("the controller may not %s %s %q", c.verb, c.resource, c.name)
		}
	}
	for _, c := range []struct{ verb, group, resource string }{
		{"get", "", "secrets"}, {"create", "", "pods"}, {"delete", "", "persistentvolumes"}, {"create", "snapshot.storage.k8s.io", "volumesnapshotcontents"},
	} {
		if m.may(account, c.verb, c.group, c.resource, "x") {
			t.Errorf("the controller may %s %s", c.verb, c.resource)
		}
	}
}

// TestAdmissionPolicies: every admission policy of deploy/ is bound to
// deny, applies to the nodes' service account as the DaemonSet runs it
// (a renamed account or namespace would silently lift them), or, the
// controller's (hostpath-csi-controller-*), to the controller's as its
// Deployment runs it, fails closed, and the certificate policy names the
// transfer signer.
func TestAdmissionPolicies(t *testing.T) {
	m := load(t)
	ds := m.daemonSets[0]
	nodeAccount := "system:serviceaccount:hostpath-csi:" + ds.Spec.Template.Spec.ServiceAccountName
	controllerAccount := "system:serviceaccount:hostpath-csi:" + m.deployment(t, "controller").Spec.Template.Spec.ServiceAccountName
	if len(m.policies) < 4 {
		t.Fatalf("%d admission policies, want those for volumes, claims, snapshot contents and certificates", len(m.policies))
	}
	bound := map[string]bool{}
	for _, b := range m.policyBinds {
		if len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionv1.Deny {
			t.Errorf("binding %s: actions %v, want [Deny]", b.Name, b.Spec.ValidationActions)
		}
		bound[b.Spec.PolicyName] = true
	}
	for _, p := range m.policies {
		if !bound[p.Name] {
			t.Errorf("policy %s has no binding", p.Name)
		}
		if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
			t.Errorf("policy %s does not fail closed", p.Name)
		}
		account := nodeAccount
		if strings.HasPrefix(p.Name, "hostpath-csi-controller-") {
			account = controllerAccount
		}
		if len(p.Spec.MatchConditions) == 0 || !strings.Contains(p.Spec.MatchConditions[0].Expression, "'"+account+"'") {
			t.Errorf("policy %s does not match %s: %v", p.Name, account, p.Spec.MatchConditions)
		}
		if p.Name == "hostpath-csi-node-certificates" && !strings.Contains(p.Spec.Validations[0].Expression, "'"+signerName(m.drivers[0].Name)+"'") {
			t.Errorf("policy %s does not name the signer %s", p.Name, signerName(m.drivers[0].Name))
		}
	}
}

// TestNetworkPolicies: the driver's pods, the signer and the controller
// each have an ingress policy; the driver's admits the transfer and
// control ports from anywhere (they authenticate) and its metrics port
// only from selected namespaces, and nothing else; the signer's and the
// controller's admit nothing.
func TestNetworkPolicies(t *testing.T) {
	m := load(t)
	by := map[string]networkingv1.NetworkPolicy{}
	for _, p := range m.netPolicies {
		by[p.Spec.PodSelector.MatchLabels["app"]] = p
	}
	node, ok := by["hostpath-csi-node"]
	if !ok {
		t.Fatal("no NetworkPolicy for the driver's pods")
	}
	ports := map[int]bool{}
	for _, r := range node.Spec.Ingress {
		for _, p := range r.Ports {
			ports[p.Port.IntValue()] = len(r.From) == 0
		}
	}
	if len(ports) != 3 || !ports[9470] || !ports[9471] || ports[9808] {
		t.Errorf("the driver's ingress: %v, want 9470 and 9471 from anywhere and 9808 from selected namespaces only", ports)
	}
	for _, app := range []string{"hostpath-csi-transfer-signer", "hostpath-csi-controller"} {
		if s, ok := by[app]; !ok || len(s.Spec.Ingress) != 0 || len(s.Spec.PolicyTypes) != 1 {
			t.Errorf("%s's policy: %+v, want all ingress denied", app, s.Spec)
		}
	}
}
