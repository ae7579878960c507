package kernel

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as its
// initramfs (Documentation/driver-api/early-userspace/buffer-format.rst).
// Uncompressed: decompressing in a TCG guest costs more than the bytes.
type cpioWriter struct {
	w    *bufio.Writer
	ino  int
	off  int64
	dirs map[string]bool
}

func newCpio(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), dirs: map[string]bool{"": true, ".": true}}
}

func (c *cpioWriter) header(name string, mode uint32, size int64, rmajor, rminor uint32) error {
	c.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	h := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rmajor, rminor, len(name)+1, 0)
	if _, err := c.w.WriteString(h + name + "\x00"); err != nil {
		return err
	}
	c.off += int64(len(h) + len(name) + 1)
	return c.pad()
}

func (c *cpioWriter) pad() error {
	n := (4 - c.off%4) % 4
	c.off += n
	_, err := c.w.Write(make([]byte, n))
	return err
}

// mkdirs adds name's parent directories that are not in the archive yet.
func (c *cpioWriter) mkdirs(name string) error {
	dir := path.Dir(name)
	if c.dirs[dir] {
		return nil
	}
	if err := c.mkdirs(dir); err != nil {
		return err
	}
	c.dirs[dir] = true
	return c.header(dir, 0o040755, 0, 0, 0)
}

// file adds the contents of r (size bytes) as name.
func (c *cpioWriter) file(name string, perm uint32, size int64, r io.Reader) error {
	if err := c.mkdirs(name); err != nil {
		return err
	}
	if err := c.header(name, 0o100000|perm, size, 0, 0); err != nil {
		return err
	}
	n, err := io.Copy(c.w, io.LimitReader(r, size))
	if err == nil && n != size {
		err = fmt.Errorf("%s: %d of %d bytes", name, n, size)
	}
	c.off += n
	if err != nil {
		return err
	}
	return c.pad()
}

// hostFile adds the host file src as name.
func (c *cpioWriter) hostFile(name, src string, perm uint32) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	return c.file(name, perm, st.Size(), f)
}

// charDev adds a character device node: the kernel opens /dev/console
// for init before anything is mounted, so it must be in the archive.
func (c *cpioWriter) charDev(name string, major, minor uint32) error {
	if err := c.mkdirs(name); err != nil {
		return err
	}
	return c.header(name, 0o020600, 0, major, minor)
}

func (c *cpioWriter) close() error {
	if err := c.header("TRAILER!!!", 0, 0, 0, 0); err != nil {
		return err
	}
	return c.w.Flush()
}

// kernelPackage is an unpacked Debian linux-image package.
type kernelPackage struct {
	root, release, vmlinuz, config, modules string
}

func findKernel(root string) (kernelPackage, error) {
	m, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(m) != 1 {
		return kernelPackage{}, fmt.Errorf("%s: want one boot/vmlinuz-* (an unpacked linux-image package), found %d", root, len(m))
	}
	rel := strings.TrimPrefix(filepath.Base(m[0]), "vmlinuz-")
	k := kernelPackage{root: root, release: rel, vmlinuz: m[0],
		config: filepath.Join(root, "boot", "config-"+rel), modules: filepath.Join(root, "lib", "modules", rel)}
	for _, p := range []string{k.config, k.modules} {
		if _, err := os.Stat(p); err != nil {
			return kernelPackage{}, err
		}
	}
	return k, nil
}

// moduleName is the kernel's name for a module file (dashes are
// underscores, as in lsmod).
func moduleName(file string) string {
	base := filepath.Base(file)
	base = base[:strings.Index(base, ".ko")]
	return strings.ReplaceAll(base, "-", "_")
}

// moduleClosure lists the module files to load for the named modules,
// each after the modules it depends on. The package ships no modules.dep
// (depmod makes it at install time), so the dependencies come from each
// module's .modinfo "depends=" entry. Modules built into the kernel
// (modules.builtin) need no file.
func moduleClosure(k kernelPackage, names []string) ([]string, error) {
	files := map[string]string{}
	err := filepath.WalkDir(filepath.Join(k.modules, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.Contains(d.Name(), ".ko") {
			files[moduleName(p)] = p
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(k.modules, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[moduleName(l)] = true
		}
	}
	var order []string
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		if seen[name] || builtin[name] {
			return nil
		}
		seen[name] = true
		f, ok := files[name]
		if !ok {
			return fmt.Errorf("kernel %s has no module %s", k.release, name)
		}
		deps, err := moduleDepends(f)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		order = append(order, f)
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func moduleDepends(file string) ([]string, error) {
	f, err := elf.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("%s: no .modinfo", file)
	}
	b, err := s.Data()
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, strings.ReplaceAll(d, "-", "_"))
			}
		}
	}
	sort.Strings(deps)
	return deps, nil
}
