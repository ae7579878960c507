package registrar

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// kubelet does what kubelet's plugin watcher does with a socket it finds:
// GetInfo, validate, NotifyRegistrationStatus.
func kubelet(t *testing.T, sock string, accept func(*registerapi.PluginInfo) string) *registerapi.PluginInfo {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := registerapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // kubelet's GetInfo timeout is 1 s; a busy test machine gets more
	defer cancel()
	info, err := c.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	reason := accept(info)
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: reason == "", Error: reason}); err != nil {
		t.Fatalf("Notify: %v", err)
	}
	return info
}

// kubeletRules are kubelet's checks of a CSI plugin's versions.
func kubeletRules(info *registerapi.PluginInfo) string {
	if info.Type != registerapi.CSIPlugin {
		return "not a CSI plugin"
	}
	if len(info.SupportedVersions) == 0 {
		return "no versions"
	}
	for _, v := range info.SupportedVersions {
		if !strings.HasPrefix(v, "1.") || strings.Count(v, ".") != 2 {
			return "unsupported version " + v
		}
	}
	return ""
}

func start(t *testing.T, dir string) (*Registrar, chan error, context.CancelFunc) {
	t.Helper()
	r, err := New(Config{Dir: dir, DriverName: "hostpath.csi.k8s.io", Endpoint: "/var/lib/kubelet/plugins/hostpath/csi.sock", CheckInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, func() bool { return r.Healthy() == nil })
	t.Cleanup(cancel)
	return r, done, cancel
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 30 s")
}

func TestRegistration(t *testing.T) {
	dir := t.TempDir()
	// A stale socket from a driver that died: replaced at start.
	stale := filepath.Join(dir, "hostpath.csi.k8s.io-reg.sock")
	l, _ := net.Listen("unix", stale)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	r, done, cancel := start(t, dir)

	info := kubelet(t, r.SocketPath(), kubeletRules)
	if info.Name != "hostpath.csi.k8s.io" || info.Endpoint != "/var/lib/kubelet/plugins/hostpath/csi.sock" || info.SupportedVersions[0] != "1.0.0" {
		t.Fatalf("GetInfo: %+v", info)
	}
	if !r.Registered() {
		t.Fatal("not registered after kubelet confirmed")
	}

	// Someone deletes the socket: kubelet deregisters; a new one appears.
	os.Remove(r.SocketPath())
	waitFor(t, func() bool { return r.Healthy() == nil })
	kubelet(t, r.SocketPath(), kubeletRules)

	// A second driver of the same name must not steal a live socket.
	r2, _ := New(Config{Dir: dir, DriverName: "hostpath.csi.k8s.io", Endpoint: "/x.sock"})
	if err := r2.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "another instance") {
		t.Fatalf("second instance: %v", err)
	}
	if r.Healthy() != nil {
		t.Fatal("the second instance disturbed the first one's socket")
	}

	// Shutdown removes the socket, so kubelet deregisters at once.
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.SocketPath()); !os.IsNotExist(err) {
		t.Fatal("socket left behind after shutdown")
	}
}

func TestRejected(t *testing.T) {
	r, done, _ := start(t, t.TempDir())
	kubelet(t, r.SocketPath(), func(*registerapi.PluginInfo) string {
		return "a plugin named hostpath.csi.k8s.io is already registered at a higher version"
	})
	select {
	case err := <-done:
		if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "already registered") {
			t.Fatalf("got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a rejected registration did not end Run")
	}
	if _, err := os.Stat(r.SocketPath()); !os.IsNotExist(err) {
		t.Fatal("socket left behind after rejection")
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []Config{{}, {Dir: "/d", DriverName: "n"}, {Dir: "/d", DriverName: "n", Endpoint: "relative.sock"}} {
		if _, err := New(c); err == nil {
			t.Errorf("accepted %+v", c)
		}
	}
}
