package iolimit_test

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/iolimit"
	"github.com/hostpath-csi/hostpath/loop"
	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary the reader TestIOPS measures: it reads
// the device named by the variable with O_DIRECT, 4 KiB at a time, once
// told to start on stdin, and prints how many reads it made per second.
const helperEnv = "HOSTPATH_IOLIMIT_READER"

func TestMain(m *testing.M) {
	if dev := os.Getenv(helperEnv); dev != "" {
		os.Exit(reader(dev))
	}
	os.Exit(m.Run())
}

func reader(dev string) int {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer f.Close()
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE) // aligned
	if err != nil {
		fmt.Println(err)
		return 1
	}
	n, _ := strconv.Atoi(os.Getenv(helperEnv + "_COUNT"))
	bufio.NewReader(os.Stdin).ReadString('\n') // in its cgroup now
	// The clock starts after the first quarter: a throttle lets a burst
	// through at the start (its first time slice's allowance), which is
	// not the rate it holds (CI measured 1,101/s under a limit of 1,000
	// with the burst counted).
	warm := n / 4
	var start time.Time
	for i := 0; i < n; i++ {
		if i == warm {
			start = time.Now()
		}
		if _, err := f.ReadAt(buf, int64(i%4096)*4096); err != nil {
			fmt.Println(err)
			return 1
		}
	}
	fmt.Printf("%.0f\n", float64(n-warm)/time.Since(start).Seconds())
	return 0
}

// readIOPS runs the reader in cgroup dir and returns the reads per
// second it made.
func readIOPS(t *testing.T, dir, dev string, n int) float64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+dev, helperEnv+"_COUNT="+strconv.Itoa(n))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	procs := "cgroup.procs"
	if err := os.WriteFile(filepath.Join(dir, procs), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("moving the reader into %s: %v", dir, err)
	}
	in.Write([]byte("go\n"))
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("reader: %v: %s", err, out.String())
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(out.String()), 64)
	if err != nil {
		t.Fatalf("reader said %q", out.String())
	}
	return v
}

func uid() string {
	b := make([]byte, 16)
	rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// tree makes a pod's and a container's cgroups (testutil.PodCgroups).
func tree(t *testing.T, h iolimit.Hierarchy, driver, uid string) (pod, ctr string) {
	t.Helper()
	return testutil.PodCgroups(t, h.Root, h.V2, driver, uid)
}

// TestLimits: a pod's cgroup is found under both cgroup drivers' names;
// a read limit set for the pod holds its container's reads to it (within
// 10%), a raised limit to the raised one, and a removed limit no
// longer holds them; an unknown pod, a bad uid and a device the kernel refuses
// are errors with their errno.
func TestLimits(t *testing.T) {
	testutil.RequireRoot(t)
	h, err := iolimit.Detect("/sys/fs/cgroup")
	if err != nil {
		t.Fatalf("no cgroup I/O controller under /sys/fs/cgroup: %v", err)
	}
	t.Logf("cgroup v2: %v, at %s", h.V2, h.Root)
	img := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 16<<20); err != nil {
		t.Fatal(err)
	}
	d, err := loop.Attach(img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(d) })
	dev, err := iolimit.DeviceOf(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	if dev.Major != unix.Major(d.Rdev) || dev.Minor != unix.Minor(d.Rdev) {
		t.Fatalf("DeviceOf(%s) = %s, want %d:%d", d.Path(), dev, unix.Major(d.Rdev), unix.Minor(d.Rdev))
	}
	// The limits tried are 1,000 and 10,000 IOPS where the device reads
	// at 20,000/s or more unlimited (this host), else a tenth and the
	// whole of a twentieth of what it reads (the emulated kernel
	// guests read a few thousand a second).
	var free float64
	{
		id := uid()
		_, ctr := tree(t, h, "cgroupfs", id)
		free = readIOPS(t, ctr, d.Path(), 4000)
	}
	low := uint64(1000)
	if free < 20000 {
		low = uint64(free / 20)
	}
	t.Logf("unlimited: %.0f reads/s; limits tried: %d and %d", free, low, 10*low)
	if low < 50 {
		t.Fatalf("unlimited reads at %.0f/s: too slow to tell a limit", free)
	}
	for _, driver := range []string{"cgroupfs", "systemd"} {
		t.Run(driver, func(t *testing.T) {
			id := uid()
			pod, ctr := tree(t, h, driver, id)
			found, err := h.PodCgroup(id)
			if err != nil || found != pod {
				t.Fatalf("PodCgroup(%s) = %q, %v; want %s", id, found, err, pod)
			}
			// The higher limit first: the removed one, last, is the
			// lower, which a busy machine's reads still clear.
			for _, limit := range []uint64{10 * low, low} {
				if err := h.Set(pod, dev, iolimit.Limits{ReadIOPS: limit, WriteBytesPerSecond: 1 << 20}); err != nil {
					t.Fatal(err)
				}
				check := ctr
				if h.V2 {
					check = pod // v2: the pod's, which its containers inherit
				}
				if got, err := h.Get(check, dev); err != nil || got != (iolimit.Limits{ReadIOPS: limit, WriteBytesPerSecond: 1 << 20}) {
					t.Fatalf("limits read back from %s: %+v, %v", check, got, err)
				}
				got := readIOPS(t, ctr, d.Path(), int(limit*2))
				t.Logf("limit %d: %.0f reads/s", limit, got)
				if got > float64(limit)*1.1 {
					t.Fatalf("reads under a %d IOPS limit: %.0f/s, want within 10%%", limit, got)
				}
				// Under it, a busy machine may have kept the reader off
				// its core (make test runs another lane beside this):
				// measured again, up to twice, the best counts. A limit
				// held too hard stays under every time.
				for try := 0; try < 2 && got < float64(limit)*0.9; try++ {
					again := readIOPS(t, ctr, d.Path(), int(limit*2))
					t.Logf("limit %d, again: %.0f reads/s", limit, again)
					if again > float64(limit)*1.1 {
						t.Fatalf("reads under a %d IOPS limit: %.0f/s, want within 10%%", limit, again)
					}
					got = max(got, again)
				}
				if got < float64(limit)*0.9 {
					// Under the limit: held too hard, or a machine too
					// busy to read that fast at all? Asked unlimited,
					// now.
					_, other := tree(t, h, "cgroupfs", uid())
					if now := readIOPS(t, other, d.Path(), 4000); now >= 2*float64(limit) {
						t.Fatalf("reads under a %d IOPS limit: %.0f/s, want within 10%% (%.0f/s unlimited now)", limit, got, now)
					} else {
						t.Logf("reads under a %d IOPS limit: %.0f/s, but only %.0f/s unlimited now: too busy a machine to tell", limit, got, now)
					}
				}
			}
			if err := h.Set(pod, dev, iolimit.Limits{}); err != nil {
				t.Fatal(err)
			}
			if got, err := h.Get(ctr, dev); err != nil || !got.IsZero() {
				t.Fatalf("limits after removing them: %+v, %v", got, err)
			}
			// Removed means no longer held to the last limit. It is not
			// compared with the unlimited rate measured first: other
			// packages' tests share the cores (CI saw 26,393/s against
			// 70,757 before any limit), but none brings the rate down to
			// within three times a limit the cgroup no longer has.
			if got := readIOPS(t, ctr, d.Path(), 4000); got < 3*float64(low) {
				t.Fatalf("reads after the limit was removed: %.0f/s, still held to the %d/s limit (%.0f/s before any)", got, low, free)
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		if _, err := h.PodCgroup(uid()); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("an unknown pod: %v, want ENOENT", err)
		}
		if _, err := h.PodCgroup("../x"); !errors.Is(err, unix.EINVAL) {
			t.Fatalf("a uid with a path in it: %v, want EINVAL", err)
		}
		if err := h.Set(filepath.Join(h.Root, "no-such-cgroup"), dev, iolimit.Limits{ReadIOPS: 1}); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a cgroup that is gone: %v, want ENOENT", err)
		}
		pod, _ := tree(t, h, "cgroupfs", uid())
		if err := h.Set(pod, iolimit.Device{Major: 4000, Minor: 1}, iolimit.Limits{ReadIOPS: 1}); !errors.Is(err, unix.ENODEV) {
			t.Fatalf("a device the kernel does not know: %v, want ENODEV", err)
		}
	})
}

// TestPodUIDOf: the pod a cgroup belongs to, from kubelet's names under
// both cgroup drivers.
func TestPodUIDOf(t *testing.T) {
	const uid = "4da1a754-023e-4d65-a132-f27fb881ad1a"
	for _, tc := range []struct{ name, want string }{
		{"pod" + uid, uid},
		{"kubepods-besteffort-pod4da1a754_023e_4d65_a132_f27fb881ad1a.slice", uid},
		{"kubepods-pod4da1a754_023e_4d65_a132_f27fb881ad1a.slice", uid},
		{"kubepods.slice", ""},
		{"burstable", ""},
		{"cri-containerd-0123.scope", ""},
	} {
		if got := iolimit.PodUIDOf(tc.name); got != tc.want {
			t.Errorf("PodUIDOf(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
