package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestImageIsReproducibleAndComplete(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := imageSpec{
		Ref: "example.test/tool:v1", Created: time.Unix(0, 0).UTC(),
		Entries: []entry{
			{Path: "/bin/tool", Source: bin},
			{Path: "/bin/sh", Link: "tool"},
			{Path: "/tmp", Dir: true, Mode: 0o1777},
		},
		Labels:     map[string]string{"org.opencontainers.image.version": "v1"},
		Entrypoint: []string{"/bin/tool"},
	}
	a, b := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	if err := writeImageFile(a, spec); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(bin, time.Now(), time.Now().Add(time.Hour)) // the source's time must not matter
	if err := writeImageFile(b, spec); err != nil {
		t.Fatal(err)
	}
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	if !bytes.Equal(ab, bb) {
		t.Fatal("two builds of the same image differ")
	}

	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(ab))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[h.Name] = data
	}
	for name, data := range files {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && d != "" {
			sum := sha256.Sum256(data)
			if hex.EncodeToString(sum[:]) != d {
				t.Fatalf("blob %s does not match its digest", name)
			}
		}
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %s %v", files["index.json"], err)
	}
	if index.Manifests[0].Annotations["io.containerd.image.name"] != spec.Ref {
		t.Fatalf("index names %v", index.Manifests[0].Annotations)
	}
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil || len(docker) != 1 || docker[0].RepoTags[0] != spec.Ref {
		t.Fatalf("manifest.json: %s %v", files["manifest.json"], err)
	}
	var cfg struct {
		Architecture, OS string
		Config           struct {
			Entrypoint []string
			Labels     map[string]string
		}
	}
	if err := json.Unmarshal(files[docker[0].Config], &cfg); err != nil || cfg.OS != "linux" || cfg.Config.Entrypoint[0] != "/bin/tool" || cfg.Config.Labels["org.opencontainers.image.version"] != "v1" {
		t.Fatalf("config %s %v", files[docker[0].Config], err)
	}
	// The layer holds the file, the link and the sticky /tmp.
	zr, err := gzip.NewReader(bytes.NewReader(files[docker[0].Layers[0]]))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*tar.Header{}
	lr := tar.NewReader(zr)
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
	}
	if h := got["bin/tool"]; h == nil || h.Mode != 0o755 || h.ModTime.Unix() != 0 || h.Uid != 0 {
		t.Fatalf("bin/tool: %+v", h)
	}
	if h := got["bin/sh"]; h == nil || h.Linkname != "tool" {
		t.Fatalf("bin/sh: %+v", h)
	}
	if h := got["tmp/"]; h == nil || h.Mode != 0o1777 {
		t.Fatalf("tmp/: %+v", h)
	}
	if got["bin/"] == nil {
		t.Fatal("parent directory missing")
	}
}

// The archive reads as both formats it carries, by an independent reader
// (skopeo, from Debian; make deps installs it): Docker's (manifest.json,
// what docker load and podman load take) and the OCI layout (what ctr
// images import takes, also exercised by every make cluster-up).
func TestArchiveReadsAsDockerAndOCI(t *testing.T) {
	if _, err := exec.LookPath("skopeo"); err != nil {
		t.Fatal("skopeo is not installed (make deps installs it)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	os.WriteFile(bin, []byte("#!binary"), 0o755)
	out := filepath.Join(dir, "img.tar")
	spec := imageSpec{Ref: "example.test/tool:v1", Created: time.Unix(0, 0).UTC(), Entries: []entry{{Path: "/tool", Source: bin}},
		Labels: map[string]string{"org.opencontainers.image.version": "v1"}, Entrypoint: []string{"/tool"}}
	if err := writeImageFile(out, spec); err != nil {
		t.Fatal(err)
	}
	for _, transport := range []string{"docker-archive:", "oci-archive:"} {
		b, err := exec.Command("skopeo", "inspect", transport+out).CombinedOutput()
		if err != nil {
			t.Fatalf("skopeo inspect %s: %v\n%s", transport, err, b)
		}
		var info struct {
			Labels       map[string]string
			Architecture string
			Layers       []string
		}
		if err := json.Unmarshal(b, &info); err != nil || info.Labels["org.opencontainers.image.version"] != "v1" || len(info.Layers) != 1 {
			t.Fatalf("skopeo inspect %s: %s (%v)", transport, b, err)
		}
	}
}
