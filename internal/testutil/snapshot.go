package testutil

import (
	"context"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// CreateSnapshot is a CreateSnapshot call: a client's, or an in-process
// driver's through Direct.
type CreateSnapshot func(context.Context, *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error)

// Client is c's CreateSnapshot.
func Client(c csipb.ControllerClient) CreateSnapshot {
	return func(ctx context.Context, r *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
		return c.CreateSnapshot(ctx, r)
	}
}

// SnapshotReady makes the snapshot req names and asks again, as the
// csi-snapshotter does, until it is ready: a snapshot is answered once
// cut, not ready while its archive or checksum is made, and a harness
// that counts on it (restores it, expects it after a crash, times it)
// waits for ready. An error, Aborted among them, is returned as it comes.
func SnapshotReady(ctx context.Context, create CreateSnapshot, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	for {
		r, err := create(ctx, req)
		if err != nil || r.GetSnapshot().GetReadyToUse() {
			return r, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
