package csi

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// pg runs Debian's PostgreSQL as its postgres user, for the tests that
// prove snapshots of a running database restore.
type pg struct {
	t        *testing.T
	bin      string
	uid, gid uint32
}

func newPG(t *testing.T) *pg {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(bins) == 0 {
		t.Fatal("PostgreSQL is not installed (make deps installs Debian's postgresql)")
	}
	sort.Strings(bins)
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("the postgres user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &pg{t: t, bin: filepath.Dir(bins[len(bins)-1]), uid: uint32(uid), gid: uint32(gid)}
}

func (p *pg) cmd(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(p.bin, name), args...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid, Gid: p.gid}}
	c.Dir = "/"
	c.Env = []string{"PATH=" + p.bin + ":/usr/bin:/bin", "LC_ALL=C"}
	return c
}

func (p *pg) run(name string, args ...string) string {
	p.t.Helper()
	out, err := p.cmd(name, args...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// own gives dir to the postgres user, and lets it through every parent
// the test made (t.TempDir's are 0700).
func (p *pg) own(dir string) {
	p.t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Chown(dir, int(p.uid), int(p.gid)); err != nil {
		p.t.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != filepath.Clean(os.TempDir()); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

// server is a postgres serving a data directory on a socket of its own.
type server struct {
	p    *pg
	sock string
	proc *exec.Cmd
}

// start runs postgres on data (crash recovery first, for a restored copy)
// and waits until it takes connections; it is stopped when the test ends.
func (p *pg) start(data string) *server {
	p.t.Helper()
	sock := filepath.Join(p.t.TempDir(), "sock")
	p.own(sock)
	c := p.cmd("postgres", "-D", data, "-k", sock, "-c", "listen_addresses=", "-c", "shared_buffers=16MB", "-c", "max_wal_size=64MB")
	logf, err := os.Create(filepath.Join(p.t.TempDir(), "postgres.log"))
	if err != nil {
		p.t.Fatal(err)
	}
	c.Stdout, c.Stderr = logf, logf
	if err := c.Start(); err != nil {
		p.t.Fatal(err)
	}
	s := &server{p: p, sock: sock, proc: c}
	p.t.Cleanup(s.stop)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if p.cmd("pg_isready", "-q", "-h", sock).Run() == nil {
			return s
		}
		if time.Now().After(deadline) || c.ProcessState != nil {
			b, _ := os.ReadFile(logf.Name())
			p.t.Fatalf("postgres on %s did not start:\n%s", data, b)
		}
	}
}

// stop shuts the server down (fast: SIGINT) and waits for it.
func (s *server) stop() {
	if s.proc == nil {
		return
	}
	s.proc.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- s.proc.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.proc.Process.Kill()
		<-done
	}
	s.proc = nil
}

func (s *server) sql(q string) string {
	s.p.t.Helper()
	return s.p.run("psql", "-h", s.sock, "-U", "postgres", "-d", "postgres", "-Atqc", q)
}

// consistent checks pgbench's invariant (every transaction's account,
// teller and branch update and its history row, all or none) and runs
// amcheck over every table and B-tree index (pg_amcheck: verify_heapam
// and bt_index_check with heapallindexed).
func (s *server) consistent(what string) int {
	s.p.t.Helper()
	got := s.sql(`select (select sum(abalance) from pgbench_accounts) = (select coalesce(sum(delta), 0) from pgbench_history)
		and (select sum(tbalance) from pgbench_tellers) = (select coalesce(sum(delta), 0) from pgbench_history)
		and (select sum(bbalance) from pgbench_branches) = (select coalesce(sum(delta), 0) from pgbench_history)`)
	if got != "t" {
		s.p.t.Fatalf("%s: pgbench's invariant is broken (balances differ from the history's deltas)", what)
	}
	s.p.run("pg_amcheck", "-h", s.sock, "-U", "postgres", "--install-missing", "--heapallindexed", "--rootdescend", "-d", "postgres")
	n, _ := strconv.Atoi(s.sql("select count(*) from pgbench_history"))
	return n
}

// TestPostgresSnapshots: PostgreSQL 15 on image volumes, pgbench writing,
// on ext4 and XFS pools. One server keeps its data directory and WAL on
// one volume, snapshotted alone; another keeps its WAL on a second
// volume, the pair snapshotted as a group. Every snapshot, restored into
// new volumes, starts (crash recovery from the instant of the cut) with
// pgbench's invariant whole and amcheck clean.
func TestPostgresSnapshots(t *testing.T) {
	testutil.RequireRoot(t)
	if !testutil.HaveTools(t, "PostgreSQL") {
		return
	}
	for _, fstype := range []string{"ext4", "xfs"} {
		t.Run(fstype, func(t *testing.T) {
			// The two file systems' servers share nothing (their own
			// sockets, state dirs and disks) and spend most of their time
			// in fsync: side by side they take little more than one.
			t.Parallel()
			p := newPG(t)
			mnt := testfs.FileSystem(t, run, fstype, 8<<30, nil, "")
			cfg := testConfig(t)
			cfg.StateDir = filepath.Join(mnt, "state")
			d := newDriver(t, cfg)
			const size = 256 << 20
			solo := createImage(t, d, "solo", size, nil)
			data := createImage(t, d, "data", size, nil)
			wal := createImage(t, d, "wal", size, nil)
			_, soloT := stageAndPublish(t, d, solo.GetVolumeId())
			_, dataT := stageAndPublish(t, d, data.GetVolumeId())
			_, walT := stageAndPublish(t, d, wal.GetVolumeId())
			for _, dir := range []string{soloT + "/pg", dataT + "/pg", walT + "/wal"} {
				p.own(dir)
			}
			p.run("initdb", "-D", soloT+"/pg", "-U", "postgres", "--auth=trust", "--no-sync")
			p.run("initdb", "-D", dataT+"/pg", "-X", walT+"/wal/pg_wal", "-U", "postgres", "--auth=trust", "--no-sync")
			servers := []*server{p.start(soloT + "/pg"), p.start(dataT + "/pg")}
			var benches []*exec.Cmd
			for _, s := range servers {
				p.run("pgbench", "-h", s.sock, "-U", "postgres", "-i", "-q", "-s", "4", "postgres")
				b := p.cmd("pgbench", "-h", s.sock, "-U", "postgres", "-n", "-c", "4", "-T", "600", "postgres")
				if err := b.Start(); err != nil {
					t.Fatal(err)
				}
				benches = append(benches, b)
				t.Cleanup(func() { b.Process.Kill(); b.Wait() })
			}
			// Cut while pgbench writes: a few seconds apart.
			var soloSnaps []string
			var groups [][]string
			for i := 0; i < 3; i++ {
				time.Sleep(1500 * time.Millisecond)
				s, err := d.CreateSnapshot(ctx, snapReq(fmt.Sprintf("solo-%d", i), solo.GetVolumeId(), nil))
				if err != nil {
					t.Fatal(err)
				}
				soloSnaps = append(soloSnaps, s.GetSnapshot().GetSnapshotId())
				g, err := d.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: fmt.Sprintf("g-%d", i), SourceVolumeIds: []string{data.GetVolumeId(), wal.GetVolumeId()}})
				if err != nil {
					t.Fatal(err)
				}
				bySource := map[string]string{}
				for _, m := range g.GetGroupSnapshot().GetSnapshots() {
					bySource[m.GetSourceVolumeId()] = m.GetSnapshotId()
				}
				groups = append(groups, []string{bySource[data.GetVolumeId()], bySource[wal.GetVolumeId()]})
			}
			for _, b := range benches {
				b.Process.Signal(syscall.SIGINT)
				b.Wait()
			}
			for _, s := range servers {
				s.stop()
			}
			restore := func(name, snap string) string {
				v := createImage(t, d, name, size, &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap}}})
				_, target := stageAndPublish(t, d, v.GetVolumeId())
				p.own(target) // its parents, for the postgres user
				return target
			}
			for i, id := range soloSnaps {
				target := restore(fmt.Sprintf("solo-r%d", i), id)
				s := p.start(target + "/pg")
				t.Logf("%s: solo snapshot %d: %d pgbench transactions, consistent", fstype, i, s.consistent(fmt.Sprintf("solo snapshot %d", i)))
				s.stop()
			}
			for i, g := range groups {
				dt, wt := restore(fmt.Sprintf("data-r%d", i), g[0]), restore(fmt.Sprintf("wal-r%d", i), g[1])
				// The restored data directory's pg_wal names the first
				// WAL volume's path: point it at the restored one.
				link := filepath.Join(dt, "pg", "pg_wal")
				if err := os.Remove(link); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Join(wt, "wal", "pg_wal"), link); err != nil {
					t.Fatal(err)
				}
				s := p.start(dt + "/pg")
				t.Logf("%s: group snapshot %d: %d pgbench transactions, consistent", fstype, i, s.consistent(fmt.Sprintf("group snapshot %d", i)))
				s.stop()
			}
		})
	}
}
