package localcluster

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// api is a bare HTTPS client of kube-apiserver with the admin
// certificate: enough to wait for readiness without client-go.
type api struct {
	server string
	http   *http.Client
}

func newAPI(server string, p *pki) *api {
	pool := x509.NewCertPool()
	if ca, err := os.ReadFile(p.path("ca.crt")); err == nil {
		pool.AppendCertsFromPEM(ca)
	}
	cert, _ := tls.LoadX509KeyPair(p.path("admin.crt"), p.path("admin.key"))
	return &api{server: server, http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}}
}

func (a *api) get(path string) (int, []byte, error) {
	resp, err := a.http.Get(a.server + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (a *api) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		code, body, err := a.get("/readyz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		last = fmt.Sprintf("%d %s %v", code, body, err)
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %v: %s", timeout, last)
}

func (a *api) waitNodeReady(name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "not registered"
	for time.Now().Before(deadline) {
		code, body, err := a.get("/api/v1/nodes/" + name)
		if err == nil && code == http.StatusOK {
			var n struct {
				Status struct {
					Conditions []struct{ Type, Status, Message string }
				}
			}
			if err := json.Unmarshal(body, &n); err == nil {
				for _, c := range n.Status.Conditions {
					if c.Type == "Ready" {
						if c.Status == "True" {
							return nil
						}
						last = c.Message
					}
				}
			}
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("not Ready after %v: %s", timeout, last)
}
