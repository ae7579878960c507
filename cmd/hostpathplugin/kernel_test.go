package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// asOldKernel is set when this test binary is re-run as the driver on a
// kernel that "lacks" openat2: a seccomp filter answers it with ENOSYS,
// exactly what a kernel before 5.6 answers.
const asOldKernel = "HOSTPATH_TEST_AS_KERNEL_WITHOUT_OPENAT2"

func TestMain(m *testing.M) {
	if os.Getenv(asOldKernel) != "" {
		if err := denyOpenat2(); err != nil {
			os.Stderr.WriteString("installing the seccomp filter: " + err.Error() + "\n")
			os.Exit(3)
		}
		o, err := parseFlags(os.Args[1:])
		if err != nil {
			os.Exit(2)
		}
		os.Exit(run(o))
	}
	os.Exit(m.Run())
}

// denyOpenat2 makes openat2(2) fail with ENOSYS in every thread of the
// process (SECCOMP_FILTER_FLAG_TSYNC).
func denyOpenat2() error {
	runtime.LockOSThread()
	const (
		auditArchX8664  = 0xc000003e
		seccompRetAllow = 0x7fff0000
		seccompRetErrno = 0x00050000
		bpfLdW          = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		bpfJeq          = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		bpfRet          = unix.BPF_RET | unix.BPF_K
	)
	prog := []unix.SockFilter{
		{Code: bpfLdW, K: 4}, // seccomp_data.arch
		{Code: bpfJeq, Jt: 0, Jf: 3, K: auditArchX8664},
		{Code: bpfLdW, K: 0}, // seccomp_data.nr
		{Code: bpfJeq, Jt: 0, Jf: 1, K: unix.SYS_OPENAT2},
		{Code: bpfRet, K: seccompRetErrno | uint32(unix.ENOSYS)},
		{Code: bpfRet, K: seccompRetAllow},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return errno
	}
	return nil
}

// TestOldKernelSaysSoAtStart: on a kernel without openat2 the driver
// stops at start with one line naming what is missing and the kernel it
// needs, before it serves anything.
func TestOldKernelSaysSoAtStart(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the seccomp filter is written for x86_64")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi.sock")
	cmd := exec.Command(os.Args[0], "--endpoint=unix://"+sock, "--nodeid=old-kernel", "--statedir="+filepath.Join(dir, "state"))
	cmd.Env = append(os.Environ(), asOldKernel+"=1")
	out, err := cmd.CombinedOutput()
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("driver on a kernel without openat2: %v, want exit status 1\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	for _, want := range []string{"hostpathplugin: kernel too old", "openat2", "Linux 5.6"} {
		if !strings.Contains(last, want) {
			t.Errorf("last line %q does not say %q; output:\n%s", last, want, out)
		}
	}
	if _, err := os.Stat(sock); err == nil {
		t.Error("the driver opened its socket before refusing the kernel")
	}
}
