package csi

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/internal/dm"
	"github.com/hostpath-csi/hostpath/internal/testfs"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// flakeyDisk is a file system on a device-mapper device over a loop
// device, whose table a test swaps between healthy and failing.
type flakeyDisk struct {
	name, dev, under, fstype, mnt string
	sectors                       uint64
}

func newFlakeyDisk(t *testing.T, fstype string) *flakeyDisk {
	t.Helper()
	const size = 300 << 20
	img := testfs.Image(t, run, testfs.Spec{FSType: fstype, Size: size})
	ld, err := loop.Attach(img, loop.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Detach(ld) })
	f := &flakeyDisk{name: fmt.Sprintf("hostpath-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")),
		under: ld.Path(), fstype: fstype, sectors: size / 512, mnt: filepath.Join(t.TempDir(), "disk")}
	if len(f.name) > 120 {
		f.name = f.name[:120]
	}
	if f.dev, err = dm.Create(f.name, f.healthy()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dm.Remove(f.name); err != nil {
			t.Errorf("removing %s: %v", f.name, err)
		}
	})
	if err := os.Mkdir(f.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f.mount(t)
	t.Cleanup(func() {
		testutil.UnmountUnder(t, f.mnt+"/")
		if err := unix.Unmount(f.mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", f.mnt, err)
		}
	})
	return f
}

func (f *flakeyDisk) mount(t *testing.T) {
	t.Helper()
	if err := unix.Mount(f.dev, f.mnt, f.fstype, 0, ""); err != nil {
		t.Fatalf("mounting %s (%s): %v", f.dev, f.fstype, err)
	}
}

// healthy passes everything through.
func (f *flakeyDisk) healthy() []dm.Target {
	return []dm.Target{{Start: 0, Length: f.sectors, Type: "linear", Params: f.under + " 0"}}
}

// whole makes the whole disk unreliable, always (up 0 s, down an hour),
// as features say: "1 error_writes" fails writes with EIO, "1
// drop_writes" acknowledges and drops them; reads work.
func (f *flakeyDisk) whole(features string) []dm.Target {
	return []dm.Target{{Start: 0, Length: f.sectors, Type: "flakey", Params: f.under + " 0 0 3600 " + features}}
}

// failing fails all I/O to the given extents (byte offset and length on
// the disk) with device-mapper's error target and passes the rest
// through. Not flakey: device-mapper sends every flush to every target,
// and a flakey target that is down fails them, so the file system's next
// journal commit would fail and shut it down; the error target takes no
// flushes, so only the chosen blocks fail.
func (f *flakeyDisk) failing(extents [][2]uint64) []dm.Target {
	slices.SortFunc(extents, func(a, b [2]uint64) int { return int(a[0]/512) - int(b[0]/512) })
	var table []dm.Target
	pos := uint64(0)
	add := func(start, end uint64, typ, extra string) {
		if end > start {
			table = append(table, dm.Target{Start: start, Length: end - start, Type: typ, Params: fmt.Sprintf("%s %d%s", f.under, start, extra)})
		}
	}
	for _, e := range extents {
		s, n := e[0]/512, (e[1]+511)/512
		if s < pos {
			continue
		}
		add(pos, s, "linear", "")
		table = append(table, dm.Target{Start: s, Length: n, Type: "error"})
		pos = s + n
	}
	add(pos, f.sectors, "linear", "")
	return table
}

func (f *flakeyDisk) set(t *testing.T, table []dm.Target) {
	t.Helper()
	if err := dm.Reload(f.name, table); err != nil {
		t.Fatal(err)
	}
}

// powerCycle unmounts (a shut-down file system unmounts; what it writes
// goes where the table sends it), makes the disk healthy and mounts it
// again: journal replay or log recovery, as after a reboot.
func (f *flakeyDisk) powerCycle(t *testing.T) {
	t.Helper()
	if err := unix.Unmount(f.mnt, 0); err != nil {
		t.Fatalf("unmounting %s: %v", f.mnt, err)
	}
	f.set(t, f.healthy())
	f.mount(t)
}
