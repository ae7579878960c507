package bench

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

var pgSeconds = flag.Int("bench.pgseconds", 15, "seconds of each pgbench run (BenchmarkPgbench)")

// postgres runs Debian's PostgreSQL binaries as its postgres user.
type postgres struct {
	bin      string
	uid, gid uint32
}

func findPostgres(b *testing.B) postgres {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	u, err := user.Lookup("postgres")
	if len(bins) == 0 || err != nil {
		b.Fatalf("PostgreSQL is needed (make deps installs Debian's postgresql): %v %v", bins, err)
	}
	sort.Strings(bins)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return postgres{bin: filepath.Dir(bins[len(bins)-1]), uid: uint32(uid), gid: uint32(gid)}
}

// command is one of PostgreSQL's programs, to run as postgres.
func (p postgres) command(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(p.bin, name), args...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: p.uid, Gid: p.gid}}
	c.Dir, c.Env = "/", []string{"PATH=" + p.bin + ":/usr/bin:/bin", "LC_ALL=C"}
	return c
}

// do runs one of PostgreSQL's programs as postgres and returns its output.
func (p postgres) do(b *testing.B, name string, args ...string) string {
	out, err := p.command(name, args...).CombinedOutput()
	if err != nil {
		b.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// serve makes a cluster in dir (on a volume) and runs it with its socket
// in sock, stopped at the end; pg_ctl -w waits until it takes connections.
func (p postgres) serve(b *testing.B, dir, sock string) {
	for _, d := range []string{dir, sock} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			b.Fatal(err)
		}
		if err := os.Chown(d, int(p.uid), int(p.gid)); err != nil {
			b.Fatal(err)
		}
	}
	// The postgres user must get through the directories above them that
	// the benchmark made (b.TempDir's are 0700); never the system's own
	// (setting /tmp to 0755 took its sticky, world-writable bit, and with
	// it apt's signature checks).
	for _, d := range []string{dir, sock} {
		for up := filepath.Dir(d); up != "/" && up != filepath.Clean(os.TempDir()); up = filepath.Dir(up) {
			os.Chmod(up, 0o755)
		}
	}
	p.do(b, "initdb", "-D", dir, "-U", "postgres", "-A", "trust", "--no-instructions")
	p.do(b, "pg_ctl", "-D", dir, "-w", "-l", filepath.Join(sock, "log"), "-o", "-k "+sock+" -c listen_addresses=''", "start")
	b.Cleanup(func() { p.command("pg_ctl", "-D", dir, "-w", "-m", "fast", "stop").Run() })
}

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// BenchmarkPgbench: pgbench's TPC-B-like load (scale 10, 4 clients, each
// commit fsynced) on PostgreSQL in an image volume against the same run
// in a directory volume of the same pool, both published through the
// driver, on each fresh pool file system, alternating in the same run.
// Goal (issue 27): the image volume's TPS at least 0.9x the directory
// volume's.
func BenchmarkPgbench(b *testing.B) {
	testutil.RequireRoot(b)
	p := findPostgres(b)
	for _, fs := range fileSystems(b) {
		d := benchDriver(b, fs, "pg")
		var dbs []struct{ name, sock string }
		for _, v := range []struct {
			name   string
			params map[string]string
		}{{"ours-image", imageParams}, {"directory", map[string]string{engine.ParamLayout: engine.LayoutDirectory}}} {
			_, mnt := mountedVolume(b, d, fs, "pg-"+v.name, 2<<30, v.params)
			sock := outDir(b, fs, "pg-sock")
			p.serve(b, filepath.Join(mnt, "pgdata"), sock)
			p.do(b, "pgbench", "-h", sock, "-U", "postgres", "-i", "-q", "-s", "10", "postgres")
			dbs = append(dbs, struct{ name, sock string }{v.name, sock})
		}
		for r := 0; r < *rounds; r++ {
			for _, db := range dbs {
				b.Run(fs.name+"/"+db.name, func(b *testing.B) {
					var tps float64
					for i := 0; i < b.N; i++ {
						out := p.do(b, "pgbench", "-h", db.sock, "-U", "postgres", "-c", "4", "-j", "2", "-T", fmt.Sprint(*pgSeconds), "postgres")
						m := tpsLine.FindStringSubmatch(out)
						if m == nil {
							b.Fatalf("no tps in pgbench's output:\n%s", out)
						}
						v, _ := strconv.ParseFloat(m[1], 64)
						tps += v
					}
					b.ReportMetric(tps/float64(b.N), "tps")
				})
			}
		}
	}
}
