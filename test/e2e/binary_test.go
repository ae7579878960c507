// Package e2e runs the built hostpathplugin binary as an operator would:
// flags, sockets, HTTP endpoint, kubelet registration and signals.
package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hostpathplugin")
	cmd := exec.Command("go", "build", "-o", bin, "../../cmd/hostpathplugin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestOperatorRun: the binary registers with a (fake) kubelet, answers
// CSI, serves /healthz and /metrics, and on SIGTERM removes both sockets
// and exits 0.
func TestOperatorRun(t *testing.T) {
	testutil.RequireRoot(t)
	bin := build(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "csi", "csi.sock")
	regDir := filepath.Join(dir, "plugins_registry")
	addr := freePort(t)
	// A stale socket from a crashed driver must not block the start.
	os.MkdirAll(filepath.Dir(sock), 0o755)
	l, _ := net.Listen("unix", sock)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	cmd := exec.Command(bin, "--endpoint=unix://"+sock, "--nodeid=e2e-node", "--statedir="+filepath.Join(dir, "state"),
		"--http-endpoint="+addr, "--plugin-registration-path="+regDir, "--kubelet-registration-path=/var/lib/kubelet/plugins/hostpath/csi.sock")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		if t.Failed() {
			t.Logf("driver output:\n%s", logs.String())
		}
	})

	waitFor(t, "/healthz", func() bool { code, _ := get("http://" + addr + "/healthz"); return code == 200 })
	regSock := filepath.Join(regDir, "hostpath.csi.k8s.io-reg.sock")
	conn, err := grpc.NewClient("unix://"+regSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil || info.GetEndpoint() != "/var/lib/kubelet/plugins/hostpath/csi.sock" || info.GetType() != "CSIPlugin" {
		t.Fatalf("GetInfo: %v %v", info, err)
	}
	if _, err := registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	cc, _ := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	if _, err := csipb.NewIdentityClient(cc).Probe(ctx, &csipb.ProbeRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := csipb.NewControllerClient(cc).CreateVolume(ctx, &csipb.CreateVolumeRequest{}); err == nil {
		t.Fatal("an empty CreateVolume succeeded")
	}
	code, body := get("http://" + addr + "/metrics")
	for _, want := range []string{`hostpath_csi_rpcs_total{code="InvalidArgument",method="/csi.v1.Controller/CreateVolume"} 1`, "hostpath_volumes 0", "hostpath_available_capacity_bytes"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %q (status %d)", want, code)
		}
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30 s after SIGTERM")
	}
	for _, p := range []string{sock, regSock} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind after SIGTERM", p)
		}
	}
}

// TestStartErrors: what stops the program at start, with one line that
// says what to fix.
func TestStartErrors(t *testing.T) {
	testutil.RequireRoot(t)
	bin := build(t)
	dir := t.TempDir()
	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o755)
	if err := syscall.Mount("tmpfs", ro, "tmpfs", syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(ro, syscall.MNT_DETACH) })
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no node id", nil, 2, "--nodeid is required"},
		{"unknown flag", []string{"--nodeid=n", "--frobnicate"}, 2, "frobnicate"},
		{"half the registration flags", []string{"--nodeid=n", "--plugin-registration-path=/x"}, 2, "go together"},
		{"read-only state dir", []string{"--nodeid=n", "--statedir=" + ro + "/state"}, 1, "read-only file system"},
		{"state dir under a file", []string{"--nodeid=n", "--statedir=/etc/hostname/state"}, 1, "state dir /etc/hostname/state"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(bin, append(tc.args, "--endpoint="+filepath.Join(dir, "s.sock"))...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit %v, want %d: %s", err, tc.code, out)
			}
			text := strings.TrimSpace(string(out))
			if strings.Count(text, "\n") != 0 || !strings.Contains(text, tc.want) {
				t.Fatalf("output %q, want one line containing %q", text, tc.want)
			}
		})
	}
}
