package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The backup test's names: PostgreSQL's namespace, Velero's, and the
// S3 gateway's credentials (a test cluster's own, reachable only inside
// it).
const (
	pgNS      = "pg"
	veleroNS  = "velero"
	s3Access  = "velero-e2e"
	s3Secret  = "velero-e2e-secret-key"
	s3Bucket  = "velero"
	backupRef = "hostpath-e2e.local/"
)

// TestBackup backs up a running PostgreSQL with Velero, as a database
// operator does, and restores it on another node (make e2e-backup): Velero
// v1.18.3 with its AWS plugin, versitygw as the S3 store, the driver from
// deploy/ with upstream's snapshot-controller. Three backups of the same
// namespace while pgbench writes: CSI snapshots; the data mover
// (--snapshot-move-data) copying the snapshot into S3; CSI snapshots with
// Velero's fsfreeze pre-hook and thaw post-hook in the pod. Each is
// restored into a namespace of its own with the source node cordoned, so
// its pod runs elsewhere; PostgreSQL recovers, pgbench's invariant holds
// and pg_amcheck is clean.
func TestBackup(t *testing.T) {
	if os.Getenv("HOSTPATH_E2E_BACKUP") == "" {
		t.Skip("needs the local cluster and Velero's images: run make e2e-backup")
	}
	cache := cacheDir()
	k := newKube(t, cache)
	velero := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(cache, "bin", "velero"), append([]string{"--kubeconfig", k.cfg, "-n", veleroNS}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("velero %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	total := time.Now()
	nodes := strings.Fields(k.must("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"))
	if len(nodes) < 2 {
		t.Fatalf("the restores must run on another node: %d nodes (make e2e-backup starts 2)", len(nodes))
	}
	step(t, "Velero's, its AWS plugin's and versitygw's images imported into every node", func() {
		importBackupImages(t, cache, nodes)
	})
	step(t, "snapshot CRDs, upstream's snapshot-controller and deploy/", func() {
		snapshotAPI(t, k)
		deployImage(t, k, imageRef(t, filepath.Join(cache, "images", "hostpathplugin.tar")))
		k.waitRegistered(nodes)
		// Velero takes CSI snapshots with the class of the driver that
		// carries its label.
		k.must("label", "volumesnapshotclass", "hostpath", "velero.io/csi-volumesnapshot-class=true", "--overwrite")
	})
	t.Cleanup(func() {
		for _, n := range nodes {
			k.run("", "uncordon", n)
		}
		if t.Failed() {
			for _, n := range []string{pgNS, veleroNS} {
				fmt.Println(k.events(n))
			}
			out, _ := k.run("", "logs", "-n", veleroNS, "deployment/velero", "--tail=60")
			fmt.Println(out)
		}
	})
	step(t, "versitygw serving S3 from a directory, and Velero installed with its AWS plugin and node-agent", func() {
		// Velero's pods reach the gateway by its Service; the velero
		// command on this host (backup logs) by the pod's address.
		s3, s3pod := startS3(t, k)
		creds := filepath.Join(t.TempDir(), "credentials")
		if err := os.WriteFile(creds, []byte(fmt.Sprintf("[default]\naws_access_key_id=%s\naws_secret_access_key=%s\n", s3Access, s3Secret)), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := velero("install", "--provider", "aws", "--image", backupRef+"velero:v1.18.3",
			"--plugins", backupRef+"velero-plugin-for-aws:v1.14.3", "--bucket", s3Bucket, "--secret-file", creds,
			"--backup-location-config", "region=us-east-1,s3ForcePathStyle=true,s3Url=http://"+s3+",publicUrl=http://"+s3pod,
			// EnableCSI: Velero 1.18 carries its CSI actions but runs them
			// only with this feature on.
			"--features=EnableCSI", "--use-volume-snapshots=false", "--use-node-agent", "--wait",
			"--velero-pod-cpu-request=50m", "--node-agent-pod-cpu-request=50m"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		k.waitFor("backup storage location available", 120*time.Second, func() (bool, string) {
			p := k.jsonpath(veleroNS, "backupstoragelocation/default", "{.status.phase}")
			return p == "Available", p + " " + k.jsonpath(veleroNS, "backupstoragelocation/default", "{.status.message}")
		})
		k.must("rollout", "status", "-n", veleroNS, "daemonset/node-agent", "--timeout=180s")
	})
	var source string
	step(t, "PostgreSQL on an image volume in namespace "+pgNS+", pgbench writing", func() {
		k.must("create", "namespace", pgNS)
		k.apply(pgBackupClaim(pgNS))
		k.apply(pgBackupPod(pgNS))
		k.waitPod(pgNS, "pg", "Running", 180*time.Second)
		k.waitFor("pgbench's first 500 transactions", 240*time.Second, func() (bool, string) {
			n := pgRowsIn(k, pgNS, "pg")
			return n >= 500, fmt.Sprint(n, " rows")
		})
		source = k.jsonpath(pgNS, "pod/pg", "{.spec.nodeName}")
		if mnt := strings.TrimSpace(k.exec(pgNS, "pg", "sh", "-c", "grep ' /data ' /proc/mounts | cut -d' ' -f3")); mnt != "ext4" {
			t.Fatalf("the database's volume is mounted as %q, want ext4 (an image volume)", mnt)
		}
	})
	type backup struct{ name, how string }
	backups := []backup{
		{"csi", "CSI snapshots"},
		{"move", "CSI snapshots moved into S3 by the data mover (--snapshot-move-data)"},
		{"freeze", "CSI snapshots between Velero's fsfreeze pre-hook and thaw post-hook"},
	}
	for _, b := range backups {
		step(t, "velero backup "+b.name+" of the running database: "+b.how, func() {
			args := []string{"backup", "create", b.name, "--include-namespaces", pgNS, "--wait"}
			switch b.name {
			case "move":
				args = append(args, "--snapshot-move-data")
			case "freeze":
				// The hooks run in the pod's privileged sidecar, on the
				// volume the database writes.
				k.must("annotate", "-n", pgNS, "pod/pg", "--overwrite",
					"pre.hook.backup.velero.io/container=fsfreeze",
					`pre.hook.backup.velero.io/command=["/bin/fsfreeze","--freeze","/data"]`,
					"post.hook.backup.velero.io/container=fsfreeze",
					`post.hook.backup.velero.io/command=["/bin/fsfreeze","--unfreeze","/data"]`)
			}
			before := pgRowsIn(k, pgNS, "pg")
			start := time.Now()
			if out, err := velero(args...); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			took := time.Since(start)
			if p := k.jsonpath(veleroNS, "backup/"+b.name, "{.status.phase}"); p != "Completed" {
				out, _ := velero("backup", "describe", b.name, "--details")
				logs, _ := velero("backup", "logs", b.name)
				t.Fatalf("backup %s is %s\n%s\n%s", b.name, p, out, lastLines(logs, 40))
			}
			after := pgRowsIn(k, pgNS, "pg")
			if after <= before {
				t.Fatalf("pgbench did not write across backup %s (%d rows before, %d after)", b.name, before, after)
			}
			fmt.Printf("e2e      backup %s completed in %.1fs while pgbench wrote (%d → %d history rows)%s\n",
				b.name, took.Seconds(), before, after, backupDetail(t, k, b.name))
		})
	}
	for i, b := range backups {
		target := fmt.Sprintf("pg-%s", b.name)
		step(t, "velero restore of "+b.name+" into "+target+", off "+source+": PostgreSQL recovers, invariant and pg_amcheck hold", func() {
			k.must("cordon", source)
			defer k.run("", "uncordon", source)
			start := time.Now()
			if out, err := velero("restore", "create", "r-"+b.name, "--from-backup", b.name,
				"--namespace-mappings", pgNS+":"+target, "--wait"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if p := k.jsonpath(veleroNS, "restore/r-"+b.name, "{.status.phase}"); p != "Completed" {
				out, _ := velero("restore", "describe", "r-"+b.name, "--details")
				logs, _ := velero("restore", "logs", "r-"+b.name)
				t.Fatalf("restore r-%s is %s\n%s\n%s", b.name, p, out, lastLines(logs, 40))
			}
			k.waitPod(target, "pg", "Running", 300*time.Second)
			k.waitFor(target+"'s checks", 300*time.Second, func() (bool, string) {
				out, err := k.run("", "exec", "-n", target, "pg", "-c", "pg", "--", "cat", "/tmp/result")
				out = strings.TrimSpace(out)
				if err == nil && out != "" && out != "ok" {
					log, _ := k.run("", "exec", "-n", target, "pg", "-c", "pg", "--", "sh", "-c", "cat /tmp/pg.log /tmp/amcheck.log")
					t.Fatalf("restore of %s: %s\n%s", b.name, out, log)
				}
				return out == "ok", out
			})
			on := k.jsonpath(target, "pod/pg", "{.spec.nodeName}")
			if on == source {
				t.Fatalf("the restore of %s runs on %s, the source node, which was cordoned", b.name, on)
			}
			fmt.Printf("e2e      restore %d (%s) on %s in %.1fs: PostgreSQL started, pgbench's invariant holds, pg_amcheck clean (%d history rows)\n",
				i+1, b.name, on, time.Since(start).Seconds(), pgRowsIn(k, target, "pg"))
		})
	}
	step(t, "backups deleted with velero backup delete, then the namespaces: no snapshot, volume or mount left on any node", func() {
		for _, b := range backups {
			if out, err := velero("backup", "delete", b.name, "--confirm"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		}
		k.waitFor("backups deleted", 180*time.Second, func() (bool, string) {
			left := k.items("backups", "-n", veleroNS)
			return len(left) == 0, fmt.Sprintf("%d backups", len(left))
		})
		for _, b := range backups {
			k.must("delete", "namespace", "pg-"+b.name, "--timeout=300s")
		}
		k.must("delete", "namespace", pgNS, "--timeout=300s")
		waitNodesClean(t, k, nodes)
	})
	fmt.Printf("e2e total %.1fs\n", time.Since(total).Seconds())
}

// importBackupImages imports the backup images (test/cluster's
// backup-images) into each node's containerd.
func importBackupImages(t *testing.T, cache string, nodes []string) {
	t.Helper()
	tars, _ := filepath.Glob(filepath.Join(cache, "images-backup", "*.tar"))
	if len(tars) != 3 {
		t.Fatalf("%d images in %s, want Velero's, its plugin's and versitygw's (make -C test/cluster backup-images)", len(tars), filepath.Join(cache, "images-backup"))
	}
	for _, n := range nodes {
		sock := filepath.Join(cache, "cluster", "nodes", n, "containerd", "containerd.sock")
		if len(nodes) == 1 {
			sock = filepath.Join(cache, "cluster", "containerd", "containerd.sock")
		}
		for _, tar := range tars {
			out, err := exec.Command(filepath.Join(cache, "bin", "ctr"), "--address", sock, "--namespace", "k8s.io", "images", "import", "--local", tar).CombinedOutput()
			if err != nil {
				t.Fatalf("importing %s into %s: %v: %s", tar, n, err, out)
			}
		}
	}
}

// startS3 runs versitygw in Velero's namespace, serving S3 from an
// emptyDir with the bucket made, and returns its Service's address and
// its pod's.
func startS3(t *testing.T, k *kube) (string, string) {
	t.Helper()
	k.must("create", "namespace", veleroNS)
	k.apply(fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: s3, namespace: %[1]s}
spec:
  selector: {app: s3}
  ports: [{port: 7070, targetPort: 7070}]
---
apiVersion: v1
kind: Pod
metadata: {name: s3, namespace: %[1]s, labels: {app: s3}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: versitygw
    image: %[2]sversitygw:v1.8.0
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /data/%[3]s && exec versitygw --port :7070 posix /data"]
    env:
    - {name: ROOT_ACCESS_KEY, value: %[4]s}
    - {name: ROOT_SECRET_KEY, value: %[5]s}
    ports: [{containerPort: 7070}]
    readinessProbe: {tcpSocket: {port: 7070}, periodSeconds: 1}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, emptyDir: {}}]
`, veleroNS, backupRef, s3Bucket, s3Access, s3Secret))
	k.waitFor("versitygw ready", 120*time.Second, func() (bool, string) {
		r := k.jsonpath(veleroNS, "pod/s3", "{.status.containerStatuses[0].ready}")
		return r == "true", r
	})
	return k.jsonpath(veleroNS, "service/s3", "{.spec.clusterIP}") + ":7070", k.jsonpath(veleroNS, "pod/s3", "{.status.podIP}") + ":7070"
}

// pgBackupClaim is the database's claim: an image volume of deploy/'s
// default class.
func pgBackupClaim(namespace string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pg-data, namespace: %s}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: hostpath
  resources: {requests: {storage: 256Mi}}
`, namespace)
}

// pgBackupPod runs PostgreSQL on the claim and a privileged busybox
// sidecar for Velero's freeze hooks. The same pod, restored by Velero,
// finds the data directory and checks it instead: it starts the server
// (crash recovery, since the copy was cut while the server ran), checks
// pgbench's invariant and runs pg_amcheck, and writes ok or what failed
// to /tmp/result. A pod starting on empty storage makes the database and
// runs pgbench until the test ends.
func pgBackupPod(namespace string) string {
	script := `set -e
if [ -d /data/pg ]; then
  rm -f /data/pg/postmaster.pid
  ` + pgServer + `
  [ "$(psql -h /tmp -U postgres -Atc '` + pgInvariant + `')" = t ] || { echo "pgbench's invariant is broken" > /tmp/result; sleep 3600; }
  pg_amcheck -h /tmp -U postgres --install-missing --heapallindexed --rootdescend -d postgres > /tmp/amcheck.log 2>&1 || { echo "pg_amcheck found corruption" > /tmp/result; sleep 3600; }
  echo ok > /tmp/result
else
  initdb -D /data/pg -U postgres --auth=trust -E UTF8 --locale=C
  ` + pgServer + `
  pgbench -h /tmp -U postgres -i -q -s 2 postgres
  pgbench -h /tmp -U postgres -n -c 4 -T 3600 postgres > /tmp/pgbench.log 2>&1 &
fi
sleep 3600`
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: pg, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  securityContext: {fsGroup: 999, fsGroupChangePolicy: OnRootMismatch}
  containers:
  - name: pg
    image: %s
    imagePullPolicy: Never
    securityContext: {runAsUser: 999, runAsGroup: 999}
    command: ["sh", "-c", %q]
    volumeMounts: [{name: v, mountPath: /data}]
  - name: fsfreeze
    image: %s
    imagePullPolicy: Never
    securityContext: {privileged: true}
    command: ["sleep", "3600"]
    volumeMounts: [{name: v, mountPath: /data}]
  volumes:
  - name: v
    persistentVolumeClaim: {claimName: pg-data}
`, namespace, postgresImage, script, busybox)
}

// pgRowsIn is how many transactions pgbench has committed in a pod's
// database (0 when it cannot be asked).
func pgRowsIn(k *kube, namespace, pod string) int {
	out, _ := k.run("", "exec", "-n", namespace, pod, "-c", "pg", "--", "psql", "-h", "/tmp", "-U", "postgres", "-Atc", "select count(*) from pgbench_history")
	n, _ := strconv.Atoi(strings.TrimSpace(out))
	return n
}

// backupDetail checks that a backup holds the volume (a CSI snapshot, or
// the data mover's upload of one, and the hooks where asked) and says
// what it holds: the snapshot's handle, or the bytes moved against the
// volume's.
func backupDetail(t *testing.T, k *kube, name string) string {
	t.Helper()
	status := func(f string) int {
		n, _ := strconv.Atoi(k.jsonpath(veleroNS, "backup/"+name, "{.status."+f+"}"))
		return n
	}
	var detail string
	if name == "move" {
		out := k.must("get", "datauploads", "-n", veleroNS, "-l", "velero.io/backup-name="+name, "-o", "json")
		var list struct {
			Items []struct {
				Status struct {
					Phase    string
					Node     string
					Progress struct{ TotalBytes, BytesDone int64 }
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 1 {
			t.Fatalf("backup %s: want one DataUpload, got %d (%v)", name, len(list.Items), err)
		}
		d := list.Items[0].Status
		if d.Phase != "Completed" || d.Progress.BytesDone == 0 {
			t.Fatalf("backup %s's data upload is %s with %d bytes", name, d.Phase, d.Progress.BytesDone)
		}
		detail = fmt.Sprintf("%d of %d bytes moved into S3 by the data mover on %s", d.Progress.BytesDone, d.Progress.TotalBytes, d.Node)
	} else {
		if a, c := status("csiVolumeSnapshotsAttempted"), status("csiVolumeSnapshotsCompleted"); a != 1 || c != 1 {
			t.Fatalf("backup %s: %d CSI snapshots attempted, %d completed; want the database's volume's", name, a, c)
		}
		detail = "its volume a CSI snapshot"
	}
	if name == "freeze" {
		if a, f := status("hookStatus.hooksAttempted"), status("hookStatus.hooksFailed"); a != 2 || f != 0 {
			t.Fatalf("backup %s: %d hooks attempted, %d failed; want the freeze and the thaw", name, a, f)
		}
		// The driver found the file system frozen by the hook (its own
		// freeze answered EBUSY) and left the thaw to the post-hook.
		logs := k.must("logs", "-n", driverNS, "-l", "app=hostpath-csi-node", "-c", "hostpath", "--tail=-1")
		vol := k.jsonpath("", "pv/"+k.jsonpath(pgNS, "pvc/pg-data", "{.spec.volumeName}"), "{.spec.csi.volumeHandle}")
		found := false
		for _, l := range strings.Split(logs, "\n") {
			found = found || strings.Contains(l, "frozen already") && strings.Contains(l, vol)
		}
		if !found {
			t.Fatalf("backup %s: the driver did not find volume %s frozen by the hook", name, vol)
		}
		detail += ", taken while the pod's fsfreeze held the file system frozen (the driver found it frozen and left the thaw to the post-hook)"
	}
	return "; " + detail
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
