package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hostpath-csi/hostpath/fsops"
	"github.com/hostpath-csi/hostpath/internal/testutil"
)

// stagedImage makes an image volume and stages it; it is unstaged,
// thawed if a case left it frozen, and detached when the test ends.
func stagedImage(t *testing.T, e *Engine) (VolumeRecord, string) {
	t.Helper()
	p, err := e.ChoosePool(nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.MakeVolume(bg, VolumeSpec{Name: "pvc-frozen", Access: AccessMount, Layout: LayoutImage, Pool: p, Capacity: SizeRange{Required: 32 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(t.TempDir(), "staging")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fsops.ThawIfFrozen(staging)
		if err := e.UnstageVolume(v.ID, staging); err != nil {
			t.Errorf("unstaging %s: %v", v.ID, err)
		}
		DetachAll(e.VolumeDataPath(v))
	})
	if err := e.stageVolume(v, staging); err != nil {
		t.Fatal(err)
	}
	v, _ = e.Records.Volumes.Get(v.ID)
	return v, staging
}

// isFrozen tells whether the file system at path is frozen, leaving it
// as it was.
func isFrozen(t *testing.T, path string) bool {
	t.Helper()
	if err := fsops.Freeze(path); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return true
		}
		t.Fatal(err)
	}
	if _, err := fsops.ThawIfFrozen(path); err != nil {
		t.Fatal(err)
	}
	return false
}

// TestFrozen: what a cut under a freeze ends with, by what happens to
// the freeze while the copy runs. An overrun of MaxFreeze cancels the
// copy's context (a copy stops; it does not run on unfrozen) and is
// refused as one; a file system someone else froze is copied and left
// frozen, unless they thawed it before the copy ended (then the copy may
// mix moments and is refused); and a freeze whose thaw failed keeps its
// record and its report while later freezes of the same volume come and
// go (records are named by freeze, not by volume).
func TestFrozen(t *testing.T) {
	testutil.RequireRoot(t)
	cases := []struct {
		name string
		// before runs ahead of the cut, with the staging path.
		before func(t *testing.T, e *Engine, v VolumeRecord, staging string)
		// copy is what runs frozen.
		copy       func(ctx context.Context, staging string) error
		maxFreeze  time.Duration
		wantErr    error
		wantFrozen bool // after the cut
		after      func(t *testing.T, e *Engine, v VolumeRecord)
	}{
		{
			name:      "a copy under our freeze",
			copy:      func(context.Context, string) error { return nil },
			maxFreeze: time.Minute,
		},
		{
			name: "an overrun cancels the copy",
			copy: func(ctx context.Context, _ string) error {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Minute):
					return errors.New("the copy's context was not cancelled at the bound")
				}
			},
			maxFreeze: 50 * time.Millisecond,
			wantErr:   ErrOverran,
		},
		{
			name: "someone else's freeze, kept through the copy",
			before: func(t *testing.T, _ *Engine, _ VolumeRecord, staging string) {
				if err := fsops.Freeze(staging); err != nil {
					t.Fatal(err)
				}
			},
			copy:       func(context.Context, string) error { return nil },
			maxFreeze:  time.Minute,
			wantFrozen: true,
		},
		{
			name: "someone else's freeze, thawed during the copy",
			before: func(t *testing.T, _ *Engine, _ VolumeRecord, staging string) {
				if err := fsops.Freeze(staging); err != nil {
					t.Fatal(err)
				}
			},
			copy: func(_ context.Context, staging string) error {
				_, err := fsops.ThawIfFrozen(staging)
				return err
			},
			maxFreeze: time.Minute,
			wantErr:   ErrBusy,
		},
		{
			name: "a stuck freeze outlives later ones",
			before: func(t *testing.T, e *Engine, v VolumeRecord, staging string) {
				// A freeze of the volume whose thaw failed: held, its
				// record kept for the next start.
				key := e.freezes.newKey(v.ID)
				rec := freezeRecord{Volume: v.ID, Image: e.VolumeDataPath(v), Path: staging}
				if err := e.recordFreeze(key, rec); err != nil {
					t.Fatal(err)
				}
				e.freezes.mu.Lock()
				e.freezes.held[key] = &heldFreeze{rec: rec, thaw: func() error { return unix.EIO }}
				e.freezes.stuck[key] = unix.EIO
				e.freezes.mu.Unlock()
				t.Cleanup(func() {
					e.freezes.mu.Lock()
					delete(e.freezes.held, key)
					delete(e.freezes.stuck, key)
					e.freezes.mu.Unlock()
				})
			},
			copy:      func(context.Context, string) error { return nil },
			maxFreeze: time.Minute,
			after: func(t *testing.T, e *Engine, v VolumeRecord) {
				left, err := filepath.Glob(filepath.Join(freezeDir(e.Paths.Root), v.ID+".*.json"))
				if err != nil || len(left) != 1 {
					t.Fatalf("freeze records after a later freeze came and went: %v (%v), want the stuck one's alone", left, err)
				}
				if err := e.StuckFreezes()[v.ID]; !errors.Is(err, unix.EIO) {
					t.Fatalf("the stuck freeze is no longer reported: %v", err)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.MaxFreeze = c.maxFreeze
			e := openEngine(t, cfg)
			v, staging := stagedImage(t, e)
			if c.before != nil {
				c.before(t, e, v, staging)
			}
			err := e.frozen(bg, []VolumeRecord{v}, func(ctx context.Context) error { return c.copy(ctx, staging) })
			if c.wantErr == nil && err != nil || c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Fatalf("the cut: %v, want %v", err, c.wantErr)
			}
			if got := isFrozen(t, staging); got != c.wantFrozen {
				t.Fatalf("frozen after the cut: %v, want %v", got, c.wantFrozen)
			}
			if c.after != nil {
				c.after(t, e, v)
				return
			}
			if left, _ := os.ReadDir(freezeDir(e.Paths.Root)); len(left) != 0 {
				t.Fatalf("freeze records left after the cut: %v", left)
			}
		})
	}
}
