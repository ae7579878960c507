package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ledgerDir is where the standby step's pgbench clients record, outside
// the database, each transaction the server acknowledged: a directory of
// the host that every node (a mount namespace of the host) and so every
// pod sees at the same path, and that a node's power cut leaves.
const ledgerDir = "/tmp/hostpath-e2e-pgledger"

// ledgerTx is pgbench's TPC-B-like transaction (its built-in one, less
// the read) with an id of its own in the history's filler; once COMMIT
// is acknowledged it appends the id and the server's clock to the ledger
// through pgbench's \shell. A transaction whose id is in the ledger was
// committed; one missing from the history after a failover was lost.
const ledgerTx = `\set aid random(1, 100000 * :scale)
\set bid random(1, :scale)
\set tid random(1, 10 * :scale)
\set delta random(-5000, 5000)
\set id random(1, 999999999999999)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime, filler) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP, CAST(:id AS text));
END;
SELECT extract(epoch from clock_timestamp()) AS ts \gset
\shell echo :id :ts >> /ledger/acked
`

// ledgerScript makes the database on a fresh volume (or recovers the one
// it finds: a server that was killed, moved or failed over left its
// postmaster.pid) and runs pgbench's clients with ledgerTx.
const ledgerScript = `fresh=
[ -d /data/pg ] || { initdb -D /data/pg -U postgres --auth=trust -E UTF8 --locale=C; fresh=1; }
rm -f /data/pg/postmaster.pid
` + pgServer + `
[ -z "$fresh" ] || pgbench -h /tmp -U postgres -i -q -s 2 postgres
cat > /tmp/tx.sql <<'EOF'
` + ledgerTx + `EOF
pgbench -h /tmp -U postgres -n -c 4 -T 3600 -s 2 -f /tmp/tx.sql postgres > /tmp/pgbench.log 2>&1`

// ledgerPod is pgPod running ledgerScript with the ledger at /ledger.
func ledgerPod(name, claim string) string {
	m := pgPod(name, claim, ledgerScript)
	m = strings.Replace(m, "volumeMounts: [{name: v, mountPath: /data}]", "volumeMounts: [{name: v, mountPath: /data}, {name: ledger, mountPath: /ledger}]", 1)
	return m + "  - name: ledger\n    hostPath: {path: " + ledgerDir + ", type: Directory}\n"
}

// ack is one acknowledged transaction of the ledger.
type ack struct {
	id string
	at time.Time
}

// acked reads the ledger.
func acked(t *testing.T) []ack {
	t.Helper()
	f, err := os.Open(filepath.Join(ledgerDir, "acked"))
	if os.IsNotExist(err) {
		return nil // nothing acknowledged yet
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []ack
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue // a line a cut client left half written
		}
		s, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		out = append(out, ack{fields[0], time.Unix(0, int64(s*1e9))})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// lostAcks reads the ledger, then the history of the database pod runs:
// the acknowledged transactions it lacks (the ledger is read first, so
// every id in it was committed before the history is asked).
func lostAcks(t *testing.T, k *kube, pod string) (lost, all []ack) {
	t.Helper()
	all = acked(t)
	out := k.exec(ns, pod, "psql", "-h", "/tmp", "-U", "postgres", "-Atc", "select trim(filler) from pgbench_history where filler is not null")
	have := map[string]bool{}
	for _, id := range strings.Fields(out) {
		have[id] = true
	}
	for _, a := range all {
		if !have[a.id] {
			lost = append(lost, a)
		}
	}
	return lost, all
}

// ackedAfter waits until pod's pgbench has a transaction acknowledged
// after since in the ledger: its server runs and takes writes.
func ackedAfter(t *testing.T, k *kube, pod string, since time.Time) time.Time {
	t.Helper()
	var first time.Time
	k.waitFor("a transaction of "+pod+"'s pgbench in the ledger", 240*time.Second, func() (bool, string) {
		for _, a := range acked(t) {
			if a.at.After(since) {
				first = a.at
				return true, ""
			}
		}
		log, _ := k.run("", "exec", "-n", ns, pod, "--", "sh", "-c", "tail -3 /tmp/pg.log /tmp/pgbench.log")
		return false, log
	})
	return first
}

// lastAckBefore is when the ledger's last transaction before t was
// acknowledged.
func lastAckBefore(acks []ack, t time.Time) time.Time {
	var last time.Time
	for _, a := range acks {
		if a.at.Before(t) && a.at.After(last) {
			last = a.at
		}
	}
	return last
}

// pgChecked runs pgbench's invariant and pg_amcheck in the running pod.
func pgChecked(t *testing.T, k *kube, pod string) {
	t.Helper()
	if got := strings.TrimSpace(k.exec(ns, pod, "psql", "-h", "/tmp", "-U", "postgres", "-Atc", pgInvariant)); got != "t" {
		t.Fatalf("pgbench's invariant in %s: %q", pod, got)
	}
	if out, err := k.run("", "exec", "-n", ns, pod, "--", "pg_amcheck", "-h", "/tmp", "-U", "postgres", "--install-missing", "--heapallindexed", "--rootdescend", "-d", "postgres"); err != nil {
		t.Fatalf("pg_amcheck in %s: %v\n%s", pod, err, out)
	}
}

// podsOn saves the manifests of the namespace's pods on node, but those
// named for claim: the out-of-service taint on a node has its pods deleted, and
// restorePods makes them again once the node is back, for the steps after
// that use them.
func podsOn(t *testing.T, k *kube, node, claim string) map[string]string {
	t.Helper()
	var list struct {
		Items []map[string]any `json:"items"`
	}
	if err := json.Unmarshal([]byte(k.must("get", "pods", "-n", ns, "--field-selector", "spec.nodeName="+node, "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	saved := map[string]string{}
	for _, p := range list.Items {
		meta, _ := p["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		if strings.HasPrefix(name, claim) {
			continue // the claim's own pods, which the step makes
		}
		p["metadata"] = map[string]any{"name": name, "namespace": ns, "labels": meta["labels"]}
		delete(p, "status")
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		saved[name] = string(b)
	}
	return saved
}

// restorePods makes again the saved pods that are gone and waits for
// them to run.
func restorePods(t *testing.T, k *kube, saved map[string]string) []string {
	t.Helper()
	var made []string
	for name, m := range saved {
		if _, err := k.run("", "get", "pod", name, "-n", ns); err == nil {
			continue
		}
		if _, err := k.run(m, "create", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		k.waitPod(ns, name, "Running", 180*time.Second)
		made = append(made, name)
	}
	return made
}

// driverLog is the log of the driver running on node: its pod's that is
// not being deleted (the out-of-service taint deletes a fenced node's
// driver pod too, and its log, served again when the node is back, is of
// the driver before the cut).
func driverLog(k *kube, node string) (string, error) {
	out, err := k.run("", "get", "pods", "-n", driverNS, "-l", "app=hostpath-csi-node", "--field-selector", "spec.nodeName="+node, "-o", "json")
	if err != nil {
		return "", err
	}
	var list struct {
		Items []struct {
			Metadata struct {
				Name              string  `json:"name"`
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return "", err
	}
	for _, p := range list.Items {
		if p.Metadata.DeletionTimestamp == nil {
			return k.run("", "logs", "-n", driverNS, p.Metadata.Name, "-c", "hostpath")
		}
	}
	return "", fmt.Errorf("no driver pod runs on %s", node)
}

// volumeLog is what the drivers on nodes logged about volume id, for a
// failure's message.
func volumeLog(k *kube, id string, nodes ...string) string {
	var out strings.Builder
	for _, n := range nodes {
		log, _ := driverLog(k, n)
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, id) {
				fmt.Fprintf(&out, "%s: %s\n", n, l)
			}
		}
	}
	return out.String()
}

// standbyCutOff: holder, which has the volume id staged for pod, cut off
// the network without a fence (its veth on the host's bridge down): a pod
// of the claim made on other, its standby's node, is not given the
// volume, its events say why (the holder, not fenced, and how to fence
// it), and other does not promote it; with the network back, every
// transaction acknowledged since pod's database came up there (since) is
// in it.
func standbyCutOff(t *testing.T, k *kube, id, holder, other, pod string, since time.Time) {
	veth := "hp-" + holder
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
	k.apply(onNode(ledgerPod("spg-cut", "spg"), other))
	var said string
	k.waitFor("spg-cut's events saying why it gets no volume", 150*time.Second, func() (bool, string) {
		said, _ = k.run("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=spg-cut", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(said, holder) && strings.Contains(said, "out-of-service"), said
	})
	if p := k.jsonpath(ns, "pod/spg-cut", "{.status.phase}"); p == "Running" {
		t.Fatalf("spg-cut runs on %s while %s, not fenced, may still be writing", other, holder)
	}
	if _, err := os.Stat(filepath.Join(nodeRoot(t, other), hddPool, "volumes", id+".img")); err == nil {
		t.Fatalf("%s promoted volume %s without a fence", other, id)
	}
	k.must("delete", "pod", "spg-cut", "-n", ns, "--grace-period=1")
	ip("link", "set", veth, "up")
	reconnected = true
	k.waitFor(holder+" Ready again", 180*time.Second, func() (bool, string) {
		r := k.jsonpath("", "node/"+holder, `{.status.conditions[?(@.type=="Ready")].status}`)
		return r == "True", r
	})
	back := time.Now()
	ackedAfter(t, k, pod, back)
	lost, all := lostAcks(t, k, pod)
	lost = slices.DeleteFunc(lost, func(a ack) bool { return a.at.Before(since) })
	if len(lost) > 0 {
		t.Fatalf("after %s was cut off: %d of the acknowledged transactions since %v missing (of %d in all)", holder, len(lost), since, len(all))
	}
	fmt.Printf("e2e      %s cut off for %v without a fence: the pod made on %s got no volume; pgbench wrote on, all %d acknowledged transactions there; the event: %s\n",
		holder, back.Sub(cut).Round(time.Second), other, len(all), lastLine(said))
}

// caughtUpRE is the driver's line for the first pull of a copy since it
// started (cmd/hostpathplugin/peers.go).
var caughtUpRE = regexp.MustCompile(`"standby copy caught up, the first time since start" volume="([^"]+)" generation=(\d+) base=(\d+) bytes=(\d+)`)

// standbyPostgres: PostgreSQL on a standby claim while pgbench writes,
// every acknowledged transaction recorded outside the database (ledgerTx):
// (a) drained, the pod made again on the standby's node: the volume moves
// with every acknowledged transaction, and the write pause is measured;
// (b) that node stopped as a power cut would and fenced: the pod runs on
// the other node within 60 s of the taint with pgbench's invariant and
// pg_amcheck clean, and the transactions lost are counted against the
// interval; (d) the node started again becomes the standby and catches up
// by changed blocks; (c) the node that holds the volume now cut off the
// network without a fence (standbyCutOff).
func standbyPostgres(t *testing.T, k *kube) {
	step(t, "PostgreSQL under pgbench on a standby claim: moved on a drain with every acknowledged transaction, not promoted while cut off, failed over within 60 s of the fence losing at most the last seconds, and the node back catching up by changed blocks", func() {
		k.apply(standbyClass)
		defer k.run("", "delete", "storageclass", "hostpath-standby")
		os.RemoveAll(ledgerDir) // what an interrupted run left
		if err := os.MkdirAll(ledgerDir, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(ledgerDir, 0o777) // the server's uid writes it
		defer os.RemoveAll(ledgerDir)
		const size = 256 << 20
		k.apply(inClass(pvc("spg", "256Mi", "Filesystem", ""), "hostpath-standby"))
		k.apply(ledgerPod("spg", "spg"))
		k.waitPod(ns, "spg", "Running", 180*time.Second)
		a := k.jsonpath(ns, "pod/spg", "{.spec.nodeName}")
		pv := k.jsonpath(ns, "pvc/spg", "{.spec.volumeName}")
		id := k.jsonpath("", "pv/"+pv, "{.spec.csi.volumeHandle}")
		b := k.jsonpath("", "pv/"+pv, `{.spec.csi.volumeAttributes.hostpath\.csi/standby}`)
		ackedAfter(t, k, "spg", time.Time{})
		k.waitFor("a generation of the copy on "+b, 60*time.Second, func() (bool, string) { return newestGeneration(t, b, id) != "", "none yet" })

		// (a) Drained: the pod goes, as an eviction takes it, and is made
		// again on the standby's node.
		k.must("delete", "pod", "spg", "-n", ns, "--grace-period=1")
		evicted := time.Now()
		k.apply(onNode(ledgerPod("spg2", "spg"), b))
		k.waitPod(ns, "spg2", "Running", 180*time.Second)
		ran := time.Since(evicted)
		first := ackedAfter(t, k, "spg2", evicted)
		lost, all := lostAcks(t, k, "spg2")
		if len(lost) > 0 {
			t.Fatalf("moved from %s to %s: %d of %d acknowledged transactions missing (the first acknowledged at %v)", a, b, len(lost), len(all), lost[0].at)
		}
		pgChecked(t, k, "spg2")
		pause := first.Sub(lastAckBefore(all, evicted))
		fmt.Printf("e2e      PostgreSQL on volume %s moved from %s to %s under pgbench: all %d acknowledged transactions there, invariant and pg_amcheck clean; the pod ran %v after it was made, writes paused %v from the last commit on %s to the first on %s\n",
			id, a, b, len(all), ran.Round(100*time.Millisecond), pause.Round(100*time.Millisecond), a, b)

		// (b) A power cut and a fence: b's every process and mount gone
		// at once, then the out-of-service taint.
		others := podsOn(t, k, b, "spg")
		localcluster(t, "node-stop", b)
		down := time.Now()
		k.must("taint", "node", b, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
		fenced := time.Now()
		k.must("delete", "pod", "spg2", "-n", ns, "--force", "--grace-period=0")
		k.apply(onNode(ledgerPod("spg3", "spg"), a))
		k.waitPod(ns, "spg3", "Running", 120*time.Second)
		took := time.Since(fenced)
		ackedAfter(t, k, "spg3", fenced)
		lost, all = lostAcks(t, k, "spg3")
		pgChecked(t, k, "spg3")
		var lastInterval int
		for _, x := range all {
			if x.at.Before(down) && x.at.After(down.Add(-2*time.Second)) {
				lastInterval++
			}
		}
		window := time.Duration(0)
		if len(lost) > 0 {
			oldest := slices.MinFunc(lost, func(x, y ack) int { return x.at.Compare(y.at) })
			window = down.Sub(oldest.at)
		}
		fmt.Printf("e2e      %s cut off and fenced: PostgreSQL ran on %s %v after the taint, invariant and pg_amcheck clean; %d of %d acknowledged transactions lost, the oldest acknowledged %v before the cut (one 2 s interval held %d)\n",
			b, a, took.Round(100*time.Millisecond), len(lost), len(all), window.Round(100*time.Millisecond), lastInterval)
		if took > 60*time.Second {
			t.Errorf("PostgreSQL ran on the standby's node %v after the taint, want within 60 s", took)
		}
		if took > 10*time.Second {
			ev, _ := k.run("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=spg3", "-o", "jsonpath={range .items[*]}{.lastTimestamp} {.reason}: {.message}{\"\\n\"}{end}")
			fmt.Printf("e2e      spg3's events:\n%s", ev)
		}
		// The copy is at most a few intervals behind (its health turns
		// abnormal past three): nothing older is lost.
		if window > 6*time.Second {
			t.Errorf("%d transactions lost, the oldest acknowledged %v before the cut: more than three 2 s intervals", len(lost), window)
		}

		// (d) b back: superseded, it becomes the standby and catches up
		// from the generation both hold.
		localcluster(t, "node-start", b)
		k.must("taint", "node", b, "node.kubernetes.io/out-of-service-")
		started := time.Now()
		var m []string
		k.waitFor(b+"'s driver catching the copy up", 300*time.Second, func() (bool, string) {
			log, err := driverLog(k, b)
			for _, l := range caughtUpRE.FindAllStringSubmatch(log, -1) {
				if l[1] == id {
					m = l
					return true, ""
				}
			}
			return false, fmt.Sprint(err)
		})
		k.waitFor("CSINode of "+b+" naming the driver", 120*time.Second, func() (bool, string) {
			d, _ := k.run("", "get", "csinode", b, "-o", "jsonpath={.spec.drivers[*].name}")
			return strings.Contains(d, "hostpath.csi.k8s.io"), d
		})
		bytes, _ := strconv.ParseInt(m[4], 10, 64)
		if m[3] == "0" || bytes >= size {
			t.Errorf("%s, back, caught up from base %s with %d bytes of a %d-byte volume: want changed blocks from a generation both held; the drivers' lines:\n%s", b, m[3], bytes, size, volumeLog(k, id, a, b))
		}
		fmt.Printf("e2e      %s back: the standby of volume %s %v after it started, caught up from generation %s to %s with %.1f MiB of the volume's %d MiB\n",
			b, id, time.Since(started).Round(time.Second), m[3], m[2], float64(bytes)/(1<<20), size>>20)
		if made := restorePods(t, k, others); len(made) > 0 {
			fmt.Printf("e2e      the pods the taint had deleted on %s made again: %s\n", b, strings.Join(made, ", "))
		}

		// (c) a holds the volume and b its copy: a cut off the network,
		// without a fence. (Last: a stage refused on a node leaves
		// kubelet's backoff for the volume there, up to 2 minutes.)
		standbyCutOff(t, k, id, a, b, "spg3", fenced)
		k.must("delete", "pod", "spg3", "-n", ns, "--grace-period=1")
		k.must("delete", "pvc", "spg", "-n", ns)
		copiesGone(t, k, id, a, b)
	})
}
