package testutil

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// PodCgroups makes the cgroups of a pod and of one container in it under
// a test root of its own in the hierarchy at root (v2: the unified one,
// with the io controller handed down), named as kubelet's cgroup driver
// ("cgroupfs" or "systemd") names them, and removes them when the test
// ends (a parent another test still uses stays).
func PodCgroups(t testing.TB, root string, v2 bool, driver, uid string) (pod, ctr string) {
	t.Helper()
	var parts []string
	switch driver {
	case "cgroupfs":
		parts = []string{"kubepods", "besteffort", "pod" + uid, "ctr-0123abcd"}
	case "systemd":
		u := strings.ReplaceAll(uid, "-", "_")
		parts = []string{"kubepods.slice", "kubepods-besteffort.slice", "kubepods-besteffort-pod" + u + ".slice", "cri-containerd-0123abcd.scope"}
	default:
		t.Fatalf("cgroup driver %q: want cgroupfs or systemd", driver)
	}
	dirs := []string{filepath.Join(root, fmt.Sprintf("hostpath-test-%d", os.Getpid()))}
	for _, p := range parts {
		dirs = append(dirs, filepath.Join(dirs[len(dirs)-1], p))
	}
	t.Cleanup(func() {
		for i := len(dirs) - 1; i >= 0; i-- {
			os.Remove(dirs[i])
		}
	})
	for i, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			t.Fatal(err)
		}
		// v2: a cgroup's children have the io controller only where it
		// hands it down; memory too where the root has it, as kubelet's
		// pods have (with it, writeback is throttled by io.max).
		if v2 && i < len(dirs)-1 {
			ctl := "+io"
			if b, _ := os.ReadFile(filepath.Join(root, "cgroup.subtree_control")); strings.Contains(string(b), "memory") {
				ctl = "+io +memory"
			}
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(ctl), 0); err != nil {
				t.Fatalf("enabling %s below %s: %v", ctl, d, err)
			}
		}
	}
	return dirs[len(dirs)-2], dirs[len(dirs)-1]
}
