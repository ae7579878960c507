// Package iolimit throttles one block device's I/O for the processes of a
// pod, with the kernel's blk-throttle through the pod's cgroups: on cgroup
// v2, io.max of the pod's cgroup, which every cgroup below it (its
// containers) is held to; on cgroup v1, the blkio.throttle files of the
// pod's cgroup and of every cgroup below it, because v1's throttling is
// not hierarchical (a limit on the pod's cgroup alone leaves its
// containers' I/O unthrottled). It finds a pod's cgroup by the names
// kubelet gives it under either cgroup driver: pod<uid> (cgroupfs) and
// kubepods[-<qos>]-pod<uid with underscores>.slice (systemd).
//
// It knows cgroups, nothing of CSI, and returns errors that unwrap to the
// errno.
package iolimit

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Limits are a device's throttles for a cgroup; zero is no limit.
type Limits struct {
	ReadIOPS, WriteIOPS                     uint64
	ReadBytesPerSecond, WriteBytesPerSecond uint64
}

// IsZero says no limit is set.
func (l Limits) IsZero() bool { return l == Limits{} }

// Device is a block device's number.
type Device struct{ Major, Minor uint32 }

// DeviceOf is the device number of a block device node (st_rdev) or, for
// anything else, of the file system that holds it (st_dev): the loop
// device under an image volume's mount.
func DeviceOf(path string) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	dev := st.Dev
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		dev = st.Rdev
	}
	return Device{Major: unix.Major(dev), Minor: unix.Minor(dev)}, nil
}

func (d Device) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// Hierarchy is a mounted cgroup hierarchy that has the I/O controller.
type Hierarchy struct {
	// Root is the directory of the hierarchy's root cgroup: the unified
	// mount (v2) or the blkio controller's (v1).
	Root string
	// V2 says the unified hierarchy (io.max).
	V2 bool
}

// Detect finds the I/O controller under mount (where the host's cgroup
// file systems are, /sys/fs/cgroup): the unified hierarchy if the io
// controller is enabled at its root, else v1's blkio.
func Detect(mount string) (Hierarchy, error) {
	if b, err := os.ReadFile(filepath.Join(mount, "cgroup.subtree_control")); err == nil {
		if !slices.Contains(strings.Fields(string(b)), "io") {
			return Hierarchy{}, &os.PathError{Op: "io controller", Path: filepath.Join(mount, "cgroup.subtree_control"), Err: unix.ENOENT}
		}
		return Hierarchy{Root: mount, V2: true}, nil
	}
	blkio := filepath.Join(mount, "blkio")
	if _, err := os.Stat(filepath.Join(blkio, "blkio.throttle.read_iops_device")); err != nil {
		return Hierarchy{}, err
	}
	return Hierarchy{Root: blkio}, nil
}

// maxDepth bounds the search for a pod's cgroup: kubelet puts it at most
// four levels under the root (its --cgroup-root, kubepods, the QoS class,
// the pod), and a node's own cgroup root adds one.
const maxDepth = 6

// PodUIDOf is the uid of the pod whose cgroup is named name, as kubelet
// names it: pod<uid> (cgroupfs) or kubepods[-<qos>]-pod<uid with
// underscores>.slice (systemd); "" for any other name.
func PodUIDOf(name string) string {
	if i := strings.LastIndex(name, "-pod"); i >= 0 && strings.HasSuffix(name, ".slice") {
		return strings.ReplaceAll(strings.TrimSuffix(name[i+len("-pod"):], ".slice"), "_", "-")
	}
	if uid, ok := strings.CutPrefix(name, "pod"); ok {
		return uid
	}
	return ""
}

// PodCgroup finds the cgroup of the pod with uid: a breadth-first search
// from the root that does not descend into any pod's cgroup. ENOENT when
// there is none (the pod is gone, or not started).
func (h Hierarchy) PodCgroup(uid string) (string, error) {
	if uid == "" || strings.ContainsAny(uid, "/.") {
		return "", &os.PathError{Op: "pod cgroup", Path: uid, Err: unix.EINVAL}
	}
	level := []string{h.Root}
	for depth := 0; depth < maxDepth && len(level) > 0; depth++ {
		var next []string
		for _, dir := range level {
			entries, err := os.ReadDir(dir)
			if err != nil {
				continue // gone meanwhile
			}
			for _, e := range entries {
				if !e.IsDir() {
					continue
				}
				switch PodUIDOf(e.Name()) {
				case uid:
					return filepath.Join(dir, e.Name()), nil
				case "":
					next = append(next, filepath.Join(dir, e.Name()))
				} // another pod's: not searched
			}
		}
		level = next
	}
	return "", &os.PathError{Op: "pod cgroup", Path: filepath.Join(h.Root, "…", "pod"+uid), Err: unix.ENOENT}
}

// Set makes l the device's limits for the cgroup dir and, on v1, every
// cgroup below it; a zero field removes that limit. Files that already
// say so are not written. A cgroup removed meanwhile below dir is
// skipped; an error writing one stops and is returned (the caller puts
// the old limits back).
func (h Hierarchy) Set(dir string, dev Device, l Limits) error {
	if h.V2 {
		return setV2(dir, dev, l)
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path != dir && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipDir
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		err = setV1(path, dev, l)
		if path != dir && errors.Is(err, fs.ErrNotExist) {
			return fs.SkipDir
		}
		return err
	})
}

// v1Files are blkio's throttle files, in Limits' order.
var v1Files = [4]string{"blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device",
	"blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"}

func (l Limits) fields() [4]uint64 {
	return [4]uint64{l.ReadIOPS, l.WriteIOPS, l.ReadBytesPerSecond, l.WriteBytesPerSecond}
}

func setV1(dir string, dev Device, l Limits) error {
	for i, v := range l.fields() {
		path := filepath.Join(dir, v1Files[i])
		cur, err := readV1(path, dev)
		if err != nil {
			return err
		}
		if cur == v {
			continue
		}
		// Writing 0 removes the device's rule.
		if err := writeFile(path, fmt.Sprintf("%s %d\n", dev, v)); err != nil {
			return err
		}
	}
	return nil
}

// readV1 is the device's value in a v1 throttle file (0: none).
func readV1(path string, dev Device) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == dev.String() {
			return strconv.ParseUint(f[1], 10, 64)
		}
	}
	return 0, nil
}

// v2Keys are io.max's keys, in Limits' order.
var v2Keys = [4]string{"riops", "wiops", "rbps", "wbps"}

func setV2(dir string, dev Device, l Limits) error {
	path := filepath.Join(dir, "io.max")
	cur, err := readV2(path, dev)
	if err != nil {
		return err
	}
	if cur == l {
		return nil
	}
	var b bytes.Buffer
	b.WriteString(dev.String())
	for i, v := range l.fields() {
		if v == 0 {
			fmt.Fprintf(&b, " %s=max", v2Keys[i])
		} else {
			fmt.Fprintf(&b, " %s=%d", v2Keys[i], v)
		}
	}
	b.WriteByte('\n')
	return writeFile(path, b.String())
}

// readV2 is the device's line of an io.max file.
func readV2(path string, dev Device) (Limits, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Limits{}, err
	}
	var v [4]uint64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != dev.String() {
			continue
		}
		for _, kv := range f[1:] {
			k, val, _ := strings.Cut(kv, "=")
			for i, key := range v2Keys {
				if k == key && val != "max" {
					n, err := strconv.ParseUint(val, 10, 64)
					if err != nil {
						return Limits{}, fmt.Errorf("%s: %q: %w", path, line, err)
					}
					v[i] = n
				}
			}
		}
	}
	return Limits{ReadIOPS: v[0], WriteIOPS: v[1], ReadBytesPerSecond: v[2], WriteBytesPerSecond: v[3]}, nil
}

// Get is the device's limits as the cgroup dir's files say.
func (h Hierarchy) Get(dir string, dev Device) (Limits, error) {
	if h.V2 {
		return readV2(filepath.Join(dir, "io.max"), dev)
	}
	var v [4]uint64
	for i, f := range v1Files {
		n, err := readV1(filepath.Join(dir, f), dev)
		if err != nil {
			return Limits{}, err
		}
		v[i] = n
	}
	return Limits{ReadIOPS: v[0], WriteIOPS: v[1], ReadBytesPerSecond: v[2], WriteBytesPerSecond: v[3]}, nil
}

// writeFile writes a cgroup file in one write (the kernel parses each
// write alone), without creating it.
func writeFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
