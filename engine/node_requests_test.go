package engine

import (
	"os/exec"
	"sync"
	"testing"

	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// TestStageBesideForks: an image volume stages every time while the
// process starts programs. A stage opens the device O_EXCL (the growth
// before the mount), and a child forked while it was open kept the
// device claimed until its exec, so the mount right after found it busy
// (EBUSY: TestPostgresSnapshots, whose PostgreSQL started beside a
// stage). The driver starts no programs; its tests, and anything that
// embeds the engine, do.
func TestStageBesideForks(t *testing.T) {
	testutil.RequireRoot(t)
	e := openEngine(t, testConfig(t))
	v, staging := stagedImage(t, e)
	if err := e.UnstageVolume(v.ID, staging); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				exec.Command("/bin/true").Run()
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	for i := range 100 {
		if err := e.Stage(bg, v.ID, staging, MountRequest{Access: AccessMount}); err != nil {
			t.Fatalf("stage %d beside forks: %v", i, err)
		}
		if err := e.UnstageVolume(v.ID, staging); err != nil {
			t.Fatal(err)
		}
	}
}
