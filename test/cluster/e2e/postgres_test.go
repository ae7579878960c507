package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// postgresImage is Debian's PostgreSQL of this machine, built into an image
// by test/cluster (images/postgres-files) and imported into every node.
const postgresImage = "localhost:1/hostpath-e2e/postgres:15"

// pgServer starts PostgreSQL on /data/pg with its socket in /tmp (no TCP,
// no JIT: the image leaves LLVM out), logging to /tmp/pg.log.
const pgServer = `pg_ctl -D /data/pg -o "-c jit=off -c listen_addresses= -k /tmp -c shared_buffers=16MB -c max_wal_size=32MB -c min_wal_size=32MB" -l /tmp/pg.log -w -t 120 start`

// pgInvariant is pgbench's own check of its TPC-B-like tables: every
// transaction adds its delta to one account, teller and branch and writes
// it to the history, so each sum equals the history's. A copy that mixes
// moments (one transaction's rows in, others not) breaks it.
const pgInvariant = `select (select sum(abalance) from pgbench_accounts) = h and (select sum(tbalance) from pgbench_tellers) = h and (select sum(bbalance) from pgbench_branches) = h from (select coalesce(sum(delta), 0) h from pgbench_history) x`

// postgresSnapshots: PostgreSQL in a pod on an image volume, pgbench
// writing, VolumeSnapshots taken meanwhile through the snapshot
// controller, as a backup tool takes them; each restored into a new claim
// and started by a new pod (crash recovery, since the copy was cut while
// the server ran), which checks pgbench's invariant and runs pg_amcheck
// over every table and index. The claims are in hostpath-hdd, whose
// pool's disk (2 GiB on one node) has room for them and the snapshots.
func postgresSnapshots(k *kube, class string, snapshots int) {
	k.t.Helper()
	claim := func(name, source string) string { return inClass(pvc(name, "128Mi", "Filesystem", source), class) }
	k.apply(claim("pg", ""))
	k.apply(pgPod("pg", "pg", `[ -d /data/pg ] || initdb -D /data/pg -U postgres --auth=trust -E UTF8 --locale=C
`+pgServer+`
pgbench -h /tmp -U postgres -i -q -s 2 postgres
touch /tmp/loaded
pgbench -h /tmp -U postgres -n -c 4 -T 3600 postgres > /tmp/pgbench.log 2>&1`))
	k.waitPod(ns, "pg", "Running", 180*time.Second)
	rows := func(pod string) int { return pgRows(k, pod) }
	waitPgbench(k, "pg")
	if mnt := mountType(k, "pg"); mnt != "ext4" {
		k.t.Fatalf("the database's volume is mounted as %q in the pod, want ext4 (an image volume)", mnt)
	}
	for i := 1; i <= snapshots; i++ {
		before := rows("pg")
		takeSnapshot(k, fmt.Sprintf("pgsnap-%d", i), "pg")
		if after := rows("pg"); after <= before {
			k.t.Fatalf("pgbench did not write across snapshot %d (%d history rows before, %d after): the snapshot was not taken under load", i, before, after)
		}
	}
	var report []string
	for i := 1; i <= snapshots; i++ {
		name := fmt.Sprintf("pgrestored-%d", i)
		k.apply(claim(name, fmt.Sprintf("{kind: VolumeSnapshot, name: pgsnap-%d, apiGroup: snapshot.storage.k8s.io}", i)))
		// The copy holds the running server's postmaster.pid; its pid
		// means nothing in this pod.
		k.apply(pgPod(name, name, `rm -f /data/pg/postmaster.pid
`+pgServer+`
[ "$(psql -h /tmp -U postgres -Atc '`+pgInvariant+`')" = t ] || { echo "pgbench's invariant is broken" > /tmp/result; exit 0; }
pg_amcheck -h /tmp -U postgres --install-missing --heapallindexed --rootdescend -d postgres > /tmp/amcheck.log 2>&1 || { echo "pg_amcheck found corruption" > /tmp/result; exit 0; }
echo ok > /tmp/result`))
		k.waitPod(ns, name, "Running", 180*time.Second)
		k.waitFor(name+"'s checks", 240*time.Second, func() (bool, string) {
			out, err := k.run("", "exec", "-n", ns, name, "--", "cat", "/tmp/result")
			out = strings.TrimSpace(out)
			if err == nil && out != "" && out != "ok" {
				log, _ := k.run("", "exec", "-n", ns, name, "--", "sh", "-c", "cat /tmp/pg.log /tmp/amcheck.log")
				k.t.Fatalf("snapshot %d restored: %s\n%s", i, out, log)
			}
			return out == "ok", out
		})
		report = append(report, fmt.Sprintf("%d history rows", rows(name)))
	}
	fmt.Printf("e2e      PostgreSQL: %d snapshots taken while pgbench wrote, each restored and started: invariant holds, pg_amcheck clean (%s)\n", snapshots, strings.Join(report, ", "))
	for i := 1; i <= snapshots; i++ {
		k.must("delete", "pod", "-n", ns, fmt.Sprintf("pgrestored-%d", i), "--wait=false")
	}
	k.must("delete", "pod", "-n", ns, "pg", "--wait=false")
}

// pgPod runs the PostgreSQL image as its postgres user (uid 999) with the
// claim at /data (group 999 through fsGroup, so initdb may make /data/pg):
// the script, then sleep. The group is given to the volume's root only
// where it lacks it (OnRootMismatch): given to every file, it would open
// the data directory to the group, which PostgreSQL refuses. It is not restarted: a server killed with its
// container leaves a data directory only a fresh pod should recover.
func pgPod(name, claim, script string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  securityContext: {runAsUser: 999, runAsGroup: 999, fsGroup: 999, fsGroupChangePolicy: OnRootMismatch}
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
    volumeMounts: [{name: v, mountPath: /data}]
  volumes:
  - name: v
    persistentVolumeClaim: {claimName: %s}
`, name, ns, postgresImage, "set -e\n"+script+"\nsleep 3600", claim)
}

// pgRows is how many transactions pgbench has committed in the pod's
// database (its history's rows; 0 when it cannot be asked).
func pgRows(k *kube, pod string) int {
	out, _ := k.run("", "exec", "-n", ns, pod, "--", "psql", "-h", "/tmp", "-U", "postgres", "-Atc", "select count(*) from pgbench_history")
	n, _ := strconv.Atoi(strings.TrimSpace(out))
	return n
}

// waitPgbench waits until pgbench has committed 500 transactions in the
// pod's database.
func waitPgbench(k *kube, pod string) {
	k.t.Helper()
	k.waitFor("pgbench writing in "+pod, 240*time.Second, func() (bool, string) {
		n := pgRows(k, pod)
		return n > 500, fmt.Sprintf("%d history rows", n)
	})
}
