package engine

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hostpath-csi/hostpath/format/ext4"
	"github.com/hostpath-csi/hostpath/internal/testutil"
	"github.com/hostpath-csi/hostpath/loop"
)

// TestAttachImageOnce: callers that find an image volume's file without
// a writable loop device at the same moment bind one device between
// them, not one each (two writable devices on one image would cache its
// blocks twice and each overwrite the other's writes).
func TestAttachImageOnce(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	d := &Engine{Paths: layout{Root: root}}
	d.Pools = map[string]*Pool{DefaultPool: {Name: DefaultPool, Paths: d.Paths}}
	if err := os.MkdirAll(d.Paths.Volumes(), 0o755); err != nil {
		t.Fatal(err)
	}
	v := VolumeRecord{ID: "vol-attach", AccessType: AccessMount, Layout: LayoutImage, CapacityBytes: 32 << 20}
	path := d.VolumeDataPath(v)
	f, err := os.Create(path)
	if err == nil {
		err = f.Truncate(v.CapacityBytes)
	}
	if err == nil {
		_, err = ext4.Format(f, ext4.Options{})
	}
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DetachAll(path) })
	for round := range 20 {
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := d.attachImage(v); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		devs, err := loop.FindAll(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) != 1 {
			t.Fatalf("round %d: %d writable loop devices on one image, want 1", round, len(devs))
		}
		if err := DetachAll(filepath.Clean(path)); err != nil {
			t.Fatal(err)
		}
	}
}
