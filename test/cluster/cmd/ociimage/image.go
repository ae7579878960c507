package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entry is one file, symlink or directory of the image's only layer.
type entry struct {
	Path   string      // absolute path in the image
	Source string      // a file on this machine, for a regular file
	Link   string      // the target, for a symlink
	Dir    bool        // an empty directory
	Mode   os.FileMode // permission bits; 0 takes the source's
}

// imageSpec is everything an image is made of.
type imageSpec struct {
	Ref                  string
	Entries              []entry
	Labels               map[string]string
	Env, Entrypoint, Cmd []string
	User, WorkDir        string
	Created              time.Time
}

// layerTar writes the layer: parent directories first, then the entries,
// all in path order, owned by root, with spec.Created as every time.
func layerTar(spec imageSpec) ([]byte, error) {
	byPath := map[string]entry{}
	for _, e := range spec.Entries {
		p := path.Clean(e.Path)
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("%s is given twice", p)
		}
		e.Path = p
		byPath[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = entry{Path: d, Dir: true, Mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := byPath[p]
		h := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: spec.Created, Format: tar.FormatPAX}
		var data []byte
		switch {
		case e.Dir:
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", int64(e.Mode&0o7777)
		case e.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.Link, 0o777
		default:
			fi, err := os.Stat(e.Source)
			if err != nil {
				return nil, err
			}
			if !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("%s is not a regular file", e.Source)
			}
			if data, err = os.ReadFile(e.Source); err != nil {
				return nil, err
			}
			mode := e.Mode
			if mode == 0 {
				mode = fi.Mode().Perm()
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, int64(mode&0o7777), int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// buildImage makes the image: empty base, one layer, the config.
func buildImage(spec imageSpec) (v1.Image, error) {
	raw, err := layerTar(spec)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	created := v1.Time{Time: spec.Created}
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{Created: created, CreatedBy: "ociimage"}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", runtime.GOARCH, created
	cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.Env = spec.Entrypoint, spec.Cmd, spec.Env
	cf.Config.User, cf.Config.WorkingDir = spec.User, spec.WorkDir
	if len(spec.Labels) > 0 {
		cf.Config.Labels = spec.Labels
	}
	return mutate.ConfigFile(img, cf)
}

// writeImageFile writes the archive under a temporary name and renames it
// into place, so a failed build never leaves a half tar that loads.
func writeImageFile(out string, spec imageSpec) error {
	img, err := buildImage(spec)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".ociimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := writeArchive(tmp, img, spec.Ref, spec.Created); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// writeArchive writes the OCI layout and Docker's manifest.json side by
// side; both name the same blobs.
func writeArchive(w io.Writer, img v1.Image, ref string, mtime time.Time) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	blobs := map[string][]byte{mdigest.Hex: manifest, cdigest.Hex: config}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var layerPaths []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		blobs[d.Hex] = b
		layerPaths = append(layerPaths, "blobs/sha256/"+d.Hex)
	}
	tag := ref
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		tag = ref[i+1:]
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     types.OCIImageIndex,
		"manifests": []map[string]any{{
			"mediaType": types.OCIManifestSchema1,
			"digest":    mdigest.String(),
			"size":      len(manifest),
			"annotations": map[string]string{
				"io.containerd.image.name":          ref,
				"org.opencontainers.image.ref.name": tag,
			},
		}},
	})
	if err != nil {
		return err
	}
	docker, err := json.Marshal([]map[string]any{{
		"Config":   "blobs/sha256/" + cdigest.Hex,
		"RepoTags": []string{ref},
		"Layers":   layerPaths,
	}})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, ModTime: mtime, Typeflag: tar.TypeDir, Format: tar.FormatUSTAR})
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := file("index.json", index); err != nil {
		return err
	}
	if err := file("manifest.json", docker); err != nil {
		return err
	}
	if err := dir("blobs/"); err != nil {
		return err
	}
	if err := dir("blobs/sha256/"); err != nil {
		return err
	}
	hexes := make([]string, 0, len(blobs))
	for h := range blobs {
		hexes = append(hexes, h)
	}
	slices.Sort(hexes)
	for _, h := range hexes {
		if err := file("blobs/sha256/"+h, blobs[h]); err != nil {
			return err
		}
	}
	return tw.Close()
}
