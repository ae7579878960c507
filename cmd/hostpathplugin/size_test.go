package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// MaxImageBinary is the most the driver's binary may weigh as the image
// ships it (stripped: make image, the Dockerfile). It was 67 MB while the
// driver linked client-go's clientset, informer factories and every API
// group; package kube keeps it to the eight groups used.
const MaxImageBinary = 35_000_000

// TestBinarySize: the binary as the image ships it is at most
// MaxImageBinary bytes, and links neither client-go's clientset nor its
// informers (whose weight kube exists to avoid).
func TestBinarySize(t *testing.T) {
	if testing.Short() {
		// make test-unprivileged runs the tests short, as nobody, whose
		// empty build cache would make this a cold build of the module
		// (about 2 minutes); make test-unit ran it as root.
		t.Skip("builds the whole module; run without -short")
	}
	bin := filepath.Join(t.TempDir(), "hostpathplugin")
	// No VCS stamp, as the image has none: a checkout its user does not
	// own (make test-unprivileged runs this as nobody) has git refuse it.
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the image's binary: %d bytes (%.1f MB)", fi.Size(), float64(fi.Size())/1e6)
	if fi.Size() > MaxImageBinary {
		t.Errorf("the image's binary is %d bytes, more than %d", fi.Size(), MaxImageBinary)
	}
	deps, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(deps)) {
		for _, heavy := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers", "k8s.io/client-go/discovery", "k8s.io/client-go/testing",
			"github.com/kubernetes-csi/external-snapshotter/client/v8/clientset", "github.com/kubernetes-csi/external-snapshotter/client/v8/informers"} {
			if p == heavy || strings.HasPrefix(p, heavy+"/") {
				t.Errorf("the binary links %s", p)
			}
		}
	}
}
