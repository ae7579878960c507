// Command ociimage builds a container image from local files, in process,
// with no container engine and no registry: an empty base, one layer, and
// the image config. It writes one tar that holds both an OCI image layout
// (index.json, blobs/) and Docker's manifest.json, so `ctr images import`,
// `docker load` and `podman load` all take it. The same inputs give the
// same bytes: every time in the image and the tar is the epoch (or
// SOURCE_DATE_EPOCH), entries are sorted, and gzip carries no name or time.
//
//	ociimage -o hostpathplugin.tar -ref ghcr.io/hostpath-csi/hostpathplugin:v0.1.0 \
//	    -file bin/hostpathplugin:/hostpathplugin -entrypoint /hostpathplugin \
//	    -label org.opencontainers.image.version=v0.1.0
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var spec imageSpec
	var files, links, dirs, labels, env, entry, cmd listFlag
	var out string
	flag.StringVar(&out, "o", "", "output tar (required)")
	flag.StringVar(&spec.Ref, "ref", "", "image name with tag, e.g. registry.k8s.io/pause:3.10 (required)")
	flag.Var(&files, "file", "SRC:DST[:MODE] a file to put in the image (repeatable; MODE octal, default the source's)")
	flag.Var(&links, "symlink", "DST:TARGET a symlink in the image (repeatable)")
	flag.Var(&dirs, "dir", "DST[:MODE] an empty directory in the image (repeatable; default mode 0755, 1777 for /tmp)")
	flag.Var(&labels, "label", "KEY=VALUE an image label (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE an environment variable (repeatable)")
	flag.Var(&entry, "entrypoint", "the entrypoint, one argument per flag")
	flag.Var(&cmd, "cmd", "the default arguments, one per flag")
	flag.StringVar(&spec.User, "user", "", "user to run as, e.g. 65532:65532")
	flag.StringVar(&spec.WorkDir, "workdir", "", "working directory")
	flag.Parse()
	if err := parse(&spec, files, links, dirs, labels, env); err != nil {
		fail(err)
	}
	spec.Entrypoint, spec.Cmd = entry, cmd
	if out == "" || spec.Ref == "" {
		fail(errors.New("-o and -ref are required"))
	}
	spec.Created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fail(fmt.Errorf("SOURCE_DATE_EPOCH=%q: %v", s, err))
		}
		spec.Created = time.Unix(n, 0).UTC()
	}
	if err := writeImageFile(out, spec); err != nil {
		fail(err)
	}
}

func parse(spec *imageSpec, files, links, dirs, labels, env []string) error {
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
			return fmt.Errorf("-file %q: want SRC:/DST[:MODE]", f)
		}
		e := entry{Path: parts[1], Source: parts[0]}
		if len(parts) == 3 {
			m, err := strconv.ParseUint(parts[2], 8, 32)
			if err != nil {
				return fmt.Errorf("-file %q: mode: %v", f, err)
			}
			e.Mode = os.FileMode(m)
		}
		spec.Entries = append(spec.Entries, e)
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, ":")
		if !ok || !strings.HasPrefix(dst, "/") || target == "" {
			return fmt.Errorf("-symlink %q: want /DST:TARGET", l)
		}
		spec.Entries = append(spec.Entries, entry{Path: dst, Link: target})
	}
	for _, d := range dirs {
		p, mode, _ := strings.Cut(d, ":")
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("-dir %q: want /DST[:MODE]", d)
		}
		m := uint64(0o755)
		if p == "/tmp" {
			m = 0o1777
		}
		if mode != "" {
			var err error
			if m, err = strconv.ParseUint(mode, 8, 32); err != nil {
				return fmt.Errorf("-dir %q: mode: %v", d, err)
			}
		}
		spec.Entries = append(spec.Entries, entry{Path: p, Dir: true, Mode: os.FileMode(m)})
	}
	spec.Labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	for _, e := range env {
		if !strings.Contains(e, "=") {
			return fmt.Errorf("-env %q: want KEY=VALUE", e)
		}
	}
	spec.Env = env
	return nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "ociimage: %v\n", err)
	os.Exit(1)
}
