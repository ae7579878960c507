// Package kernel runs the project's tests in QEMU guests booting
// distribution kernels (make test-kernel), the way kernel-facing Go
// projects test against a matrix of kernels: the host unpacks Debian's
// linux-image package, builds an initramfs holding the guest init
// (test/kernel/guest), the static test binaries, the driver and the
// modules the tests need, prepares the file-system images the tests would
// make with mkfs on a virtio scratch disk, boots, reads the serial
// console and counts what passed.
package kernel

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

// Environment the Makefile's test-kernel target sets.
const (
	envKernels = "HOSTPATH_KERNELS"    // space-separated unpacked linux-image packages
	envBin     = "HOSTPATH_KERNEL_BIN" // init, hostpathplugin and <pkg>.test binaries
	envWork    = "HOSTPATH_KERNEL_WORK"
	envRun     = "HOSTPATH_KERNEL_RUN" // optional -test.run pattern for every binary (KERNEL_RUN=)
)

// modules the tests need, beyond what Debian builds in.
var modules = []string{
	"crc32c_generic", // ext4 and btrfs ask the crypto API for crc32c; no modprobe answers in the guest
	"virtio_pci", "virtio_blk",
	"loop", "fuse",
	"ext4", "xfs", "btrfs",
	"quota_v2",            // ext4's quota feature keeps its quota files in the v2 format
	"dm_mod", "dm_flakey", // the device-fault tests (csi's TestDeviceFaults)
}

// templates are the file systems the tests make with testfs.FileSystem;
// the guest has no mkfs and copies these instead (it names a missing one).
var templates = []testfs.Spec{
	{FSType: "ext4", Size: 300 << 20},
	{FSType: "ext4", Size: 300 << 20, MkfsArgs: []string{"-O", "project,quota"}},
	{FSType: "ext4", Size: 64 << 20, MkfsArgs: []string{"-m", "0"}},
	{FSType: "xfs", Size: 300 << 20},
	{FSType: "btrfs", Size: 300 << 20},
	{FSType: "btrfs", Size: 300 << 20, Setup: [][]string{{"btrfs", "quota", "enable"}}},
	{FSType: "btrfs", Size: 400 << 20, Setup: [][]string{{"btrfs", "quota", "enable"}}},
	{FSType: "btrfs", Size: 2 << 30},
	{FSType: "ext4", Size: 1 << 30}, // the image volume tests' pools
	{FSType: "xfs", Size: 1 << 30},
	{FSType: "btrfs", Size: 1 << 30},                                        // TestImageSnapshotMetadata's
	{FSType: "xfs", Size: 300 << 20, MkfsArgs: []string{"-m", "reflink=1"}}, // TestSharedRanges'
	{FSType: "ext4", Size: 2 << 30},                                         // TestImageXFS's: three XFS volumes of 300 MiB and a growth
	{FSType: "xfs", Size: 2 << 30},
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %w\n%s", name, args, err, out)
	}
	return nil
}

// result is what one test binary's run counted.
type result struct {
	name                    string
	passed, failed, skipped int
	rc                      int
	seconds                 float64
	ended                   bool
}

func TestKernel(t *testing.T) {
	kernels := strings.Fields(os.Getenv(envKernels))
	bin, work := os.Getenv(envBin), os.Getenv(envWork)
	if len(kernels) == 0 || bin == "" || work == "" {
		t.Skipf("boots kernels in QEMU: run make test-kernel (it sets %s, %s and %s)", envKernels, envBin, envWork)
	}
	testutil.RequireRoot(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal("qemu-system-x86_64 not found: install Debian's qemu-system-x86 (make kernel-deps does)")
	}
	var total, failed int
	var lines []string
	for _, root := range kernels {
		k, err := findKernel(root)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(k.release, func(t *testing.T) {
			res, summary := boot(t, qemu, k, bin, filepath.Join(work, k.release))
			for _, r := range res {
				total += r.passed
				failed += r.failed
			}
			lines = append(lines, summary)
		})
	}
	for _, l := range lines {
		fmt.Println(l)
	}
	fmt.Printf("%d passed, %d failed\n", total, failed)
}

// boot runs the plan in one kernel and reports per test binary.
func boot(t *testing.T, qemu string, k kernelPackage, bin, work string) ([]result, string) {
	os.RemoveAll(work)
	if err := os.MkdirAll(filepath.Join(work, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	mods, err := moduleClosure(k, modules)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range templates {
		testfs.MakeTemplate(t, run, filepath.Join(work, "templates"), s)
	}
	// The scratch disk: a journaled ext4 (as users' is) holding the
	// templates, mounted on /tmp in the guest. mke2fs -d keeps holes.
	scratch := filepath.Join(work, "scratch.img")
	f, err := os.Create(scratch)
	if err == nil {
		err = f.Truncate(24 << 30) // sparse: only what the guest writes takes room
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := run("mkfs.ext4", "-q", "-d", filepath.Join(work, "templates"), scratch); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(work, "templates"))

	pl := plan.Plan{Disk: "scratch"}
	for _, m := range mods {
		pl.Modules = append(pl.Modules, "/lib/modules/"+k.release+strings.TrimPrefix(m, k.modules))
	}
	tests, _ := filepath.Glob(filepath.Join(bin, "*.test"))
	sort.Strings(tests)
	env := []string{testfs.TemplatesEnv + "=/tmp"}
	for _, f := range tests {
		name := strings.TrimSuffix(filepath.Base(f), ".test")
		args := []string{"/bin/" + filepath.Base(f), "-test.v", "-test.count=1", "-test.timeout=40m"}
		if r := os.Getenv(envRun); r != "" {
			args = append(args, "-test.run="+r)
		}
		if name == "sanity" {
			senv := append(env, "SANITY_DRIVER_BIN=/bin/hostpathplugin")
			pl.Runs = append(pl.Runs, plan.Run{Name: "sanity-mount", Args: args, Env: senv},
				plan.Run{Name: "sanity-block", Args: args, Env: append(senv, "SANITY_ACCESS_TYPE=block")},
				plan.Run{Name: "sanity-image", Args: args, Env: append(senv, "SANITY_LAYOUT=image")})
			continue
		}
		pl.Runs = append(pl.Runs, plan.Run{Name: name, Args: args, Env: env})
	}
	if len(pl.Runs) == 0 {
		t.Fatalf("no test binaries in %s", bin)
	}

	for _, f := range append([]string{filepath.Join(bin, "init"), filepath.Join(bin, "hostpathplugin")}, tests...) {
		if err := static(f); err != nil {
			t.Fatal(err)
		}
	}
	initrd := filepath.Join(work, "initrd.cpio")
	writeInitramfs(t, initrd, k, bin, tests, mods, pl)
	t.Logf("kernel %s: %d modules, %d templates, initramfs and scratch disk made in %.1f s", k.release, len(mods), len(templates), time.Since(start).Seconds())

	logPath := filepath.Join(work, "console.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// TCG (no /dev/kvm here), one thread per vCPU; -cpu max gives the
	// guest SSE4.2 and friends, which crc32c and Go's runtime use.
	cmd := exec.Command(qemu, "-nodefaults", "-display", "none", "-no-reboot",
		"-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2", "-m", "4096",
		"-kernel", k.vmlinuz, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet "+testutil.GuestEnv+"=1",
		"-drive", "file="+scratch+",format=raw,if=none,id=scratch,cache=unsafe",
		"-device", "virtio-blk-pci,drive=scratch,serial=scratch",
		"-serial", "stdio")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	bootStart := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(75*time.Minute, func() { cmd.Process.Kill() })
	defer timer.Stop()
	res, done, kernelLine := readConsole(io.TeeReader(out, logf))
	werr := cmd.Wait()
	elapsed := time.Since(bootStart)

	var passed, failed, skipped int
	for _, r := range res {
		passed, failed, skipped = passed+r.passed, failed+r.failed, skipped+r.skipped
		status := "ok"
		if !r.ended {
			status = "did not finish"
		} else if r.rc != 0 {
			status = fmt.Sprintf("exit %d", r.rc)
		}
		fmt.Printf("  %-14s %4d passed %3d failed %3d skipped %7.1f s  %s\n", r.name, r.passed, r.failed, r.skipped, r.seconds, status)
		if !r.ended || r.rc != 0 {
			t.Errorf("%s in kernel %s: %s (console log: %s)", r.name, k.release, status, logPath)
		}
	}
	if len(res) != len(pl.Runs) {
		t.Errorf("kernel %s: %d of %d test binaries ran", k.release, len(res), len(pl.Runs))
	}
	if !done {
		b, _ := os.ReadFile(logPath)
		t.Errorf("kernel %s: the guest did not finish its plan (qemu: %v); console log %s ends:\n%s", k.release, werr, logPath, tail(string(b), 40))
	}
	if failed > 0 {
		t.Errorf("kernel %s: %d failed; console log: %s", k.release, failed, logPath)
	}
	return res, fmt.Sprintf("kernel %s (%s): %d passed, %d failed, %d skipped in %.0f s of guest time",
		k.release, kernelLine, passed, failed, skipped, elapsed.Seconds())
}

func writeInitramfs(t *testing.T, initrd string, k kernelPackage, bin string, tests, mods []string, pl plan.Plan) {
	f, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c := newCpio(f)
	must := func(err error) {
		if err != nil {
			t.Fatalf("initramfs: %v", err)
		}
	}
	must(c.charDev("dev/console", 5, 1))
	must(c.hostFile("init", filepath.Join(bin, "init"), 0o755))
	must(c.hostFile("bin/hostpathplugin", filepath.Join(bin, "hostpathplugin"), 0o755))
	for _, tf := range tests {
		must(c.hostFile("bin/"+filepath.Base(tf), tf, 0o755))
	}
	for i, m := range mods {
		must(c.hostFile(strings.TrimPrefix(pl.Modules[i], "/"), m, 0o644))
	}
	// The kernel's configuration, where testutil.KernelHas looks for it.
	must(c.hostFile("boot/config-"+k.release, k.config, 0o644))
	b, _ := json.MarshalIndent(pl, "", "  ")
	must(c.file(strings.TrimPrefix(plan.Path, "/"), 0o644, int64(len(b)), strings.NewReader(string(b))))
	must(c.close())
}

var (
	reResult = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): `)
	reSanity = regexp.MustCompile(`^csi-sanity-\S+: (\d+) passed, (\d+) failed, (\d+) skipped`)
	reEnd    = regexp.MustCompile(`^` + plan.MarkEnd + `(\S+) rc=(-?\d+) seconds=([\d.]+)`)
)

// readConsole follows the guest's console: it prints the lines a person
// watching wants (markers, failures, panics, csi-sanity's count) and
// counts every test and subtest result of each run. csi-sanity's specs
// are counted from its own line, not as the one Go test that runs them.
func readConsole(r io.Reader) (res []result, done bool, kernel string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur *result
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		switch {
		case strings.HasPrefix(line, plan.MarkRun):
			res = append(res, result{name: strings.TrimPrefix(line, plan.MarkRun)})
			cur = &res[len(res)-1]
			fmt.Println(line)
		case strings.HasPrefix(line, plan.MarkEnd):
			if m := reEnd.FindStringSubmatch(line); m != nil && cur != nil {
				cur.rc, _ = strconv.Atoi(m[2])
				cur.seconds, _ = strconv.ParseFloat(m[3], 64)
				cur.ended = true
			}
			fmt.Println(line)
		case line == plan.MarkDone:
			done = true
			fmt.Println(line)
		case strings.HasPrefix(line, plan.MarkKernel):
			kernel = strings.TrimPrefix(line, plan.MarkKernel)
			fmt.Println(line)
		case strings.HasPrefix(line, plan.Mark), strings.HasPrefix(line, "panic:"), strings.Contains(line, "Kernel panic"):
			fmt.Println(line)
		case cur != nil && reSanity.MatchString(line):
			m := reSanity.FindStringSubmatch(line)
			p, _ := strconv.Atoi(m[1])
			f, _ := strconv.Atoi(m[2])
			s, _ := strconv.Atoi(m[3])
			cur.passed, cur.failed, cur.skipped = cur.passed+p, cur.failed+f, cur.skipped+s
			fmt.Println(line)
		case cur != nil && reResult.MatchString(line):
			switch reResult.FindStringSubmatch(line)[1] {
			case "PASS":
				if !strings.Contains(line, "TestSanity") {
					cur.passed++
				}
			case "FAIL":
				if !strings.Contains(line, "TestSanity") {
					cur.failed++
				}
				fmt.Println(cur.name + ": " + strings.TrimSpace(line))
			case "SKIP":
				cur.skipped++
			}
		}
	}
	return res, done, kernel
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// static fails for a binary the guest cannot run: it has no dynamic
// loader and no libc (build with CGO_ENABLED=0).
func static(file string) error {
	f, err := elf.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; the guest has no libc: build it with CGO_ENABLED=0", file)
		}
	}
	return nil
}
