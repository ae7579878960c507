// Package registrar registers the driver with kubelet in-process, as the
// node-driver-registrar sidecar would: it serves the plugin registration
// API (k8s.io/kubelet/pkg/apis/pluginregistration/v1) on
// <plugins_registry>/<driver>-reg.sock.
//
// Kubelet deregisters a plugin only when that socket disappears, and never
// notices a dead plugin whose socket is left behind, so the registrar
// owns the socket's whole life: it replaces a stale one at start (but
// refuses to steal a live one), re-creates it when someone deletes it,
// removes it on shutdown, and reports a rejection from kubelet so the
// driver can exit and be restarted.
package registrar

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// SupportedVersions are the CSI versions announced to kubelet; kubelet
// wants the highest to be 1.x.
var SupportedVersions = []string{"1.0.0"}

// Config says what to register.
type Config struct {
	// Dir is kubelet's plugins_registry directory as this process sees it.
	Dir string
	// DriverName is the CSI driver name.
	DriverName string
	// Endpoint is the CSI socket path as kubelet sees it on the host.
	Endpoint string
	// CheckInterval is how often the socket's presence is checked
	// (kubelet's reconciler runs every second).
	CheckInterval time.Duration
}

// ErrRejected is returned by Run when kubelet says the registration
// failed; the error text carries kubelet's reason.
var ErrRejected = errors.New("kubelet rejected the plugin registration")

// Registrar serves the registration API.
type Registrar struct {
	cfg  Config
	path string

	mu         sync.Mutex
	ino        uint64 // inode of the socket we made
	registered bool
	rejected   chan string
}

// New checks the configuration.
func New(cfg Config) (*Registrar, error) {
	if cfg.Dir == "" || cfg.DriverName == "" || cfg.Endpoint == "" {
		return nil, fmt.Errorf("registration needs the plugins_registry dir, the driver name and the endpoint kubelet sees")
	}
	if !filepath.IsAbs(cfg.Endpoint) {
		return nil, fmt.Errorf("--kubelet-registration-path %q must be an absolute path on the host", cfg.Endpoint)
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = time.Second
	}
	return &Registrar{cfg: cfg, path: filepath.Join(cfg.Dir, cfg.DriverName+"-reg.sock"), rejected: make(chan string, 1)}, nil
}

// SocketPath is the registration socket.
func (r *Registrar) SocketPath() string { return r.path }

// Registered reports whether kubelet confirmed the registration.
func (r *Registrar) Registered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered
}

// Healthy says whether the registration socket is ours and in place.
func (r *Registrar) Healthy() error {
	r.mu.Lock()
	ino := r.ino
	r.mu.Unlock()
	fi, err := os.Stat(r.path)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Ino != ino {
		return fmt.Errorf("registration socket %s was replaced", r.path)
	}
	return nil
}

// Run serves until ctx is done (then it removes the socket and returns
// nil) or kubelet rejects the registration (ErrRejected).
func (r *Registrar) Run(ctx context.Context) error {
	if err := os.MkdirAll(r.cfg.Dir, 0o755); err != nil {
		return err
	}
	if live(r.path) {
		return fmt.Errorf("%s is served by a running process: another instance of driver %s is registered on this node", r.path, r.cfg.DriverName)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &service{r: r})
	defer func() {
		// Let a call in flight (kubelet's NotifyRegistrationStatus that
		// ended Run) get its answer, but not for long.
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			srv.Stop()
		}
	}()
	lis, err := r.listen()
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(lis) }() // returns once lis is closed
	defer r.remove()
	cur := lis

	tick := time.NewTicker(r.cfg.CheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case reason := <-r.rejected:
			return fmt.Errorf("%w: %s", ErrRejected, reason)
		case <-tick.C:
			if r.Healthy() == nil {
				continue
			}
			// Deleted or replaced: kubelet has deregistered us. A new
			// socket makes it register the driver again.
			lis, err := r.listen()
			if err != nil {
				return fmt.Errorf("re-creating %s: %w", r.path, err)
			}
			cur.Close()
			cur = lis
			go func() { _ = srv.Serve(lis) }()
		}
	}
}

// listen replaces whatever is at the path with a fresh socket.
func (r *Registrar) listen() (net.Listener, error) {
	if err := os.Remove(r.path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("removing stale %s: %w", r.path, err)
	}
	lis, err := net.Listen("unix", r.path)
	if err != nil {
		return nil, err
	}
	// The socket file is ours to remove: Go's listener would unlink it on
	// Close even after someone replaced it.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err := os.Stat(r.path)
	if err != nil {
		lis.Close()
		return nil, err
	}
	r.mu.Lock()
	r.ino = fi.Sys().(*syscall.Stat_t).Ino
	r.registered = false
	r.mu.Unlock()
	return lis, nil
}

// remove deletes the socket if it is still the one we made, so kubelet
// deregisters the driver.
func (r *Registrar) remove() {
	if r.Healthy() == nil {
		os.Remove(r.path)
	}
}

// live reports whether a process answers on the socket at path.
func live(path string) bool {
	if _, err := os.Stat(path); err != nil {
		return false
	}
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	return err == nil
}

type service struct {
	registerapi.UnimplementedRegistrationServer
	r *Registrar
}

func (s *service) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.r.cfg.DriverName,
		Endpoint:          s.r.cfg.Endpoint,
		SupportedVersions: SupportedVersions,
	}, nil
}

func (s *service) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.r.mu.Lock()
	s.r.registered = st.GetPluginRegistered()
	s.r.mu.Unlock()
	if !st.GetPluginRegistered() {
		select {
		case s.r.rejected <- st.GetError():
		default:
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
