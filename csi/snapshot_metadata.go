package csi

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/fsops"
)

// The SnapshotMetadata service (behind --enable-snapshot-metadata, as in
// the reference) lets a backup tool read only what a block snapshot holds
// or what changed between two: the engine reads the ranges from the
// snapshot file's extents (SEEK_DATA/SEEK_HOLE) and, for deltas, compares
// two snapshots of the same volume, skipping the blocks they share.

const (
	defaultMetadataResults = 256
	deltaBlock             = engine.DeltaBlock
)

func (d *Driver) blockSnapshot(id string) (engine.SnapshotRecord, error) {
	if err := d.checkIDHere("snapshot_id", id); err != nil {
		return engine.SnapshotRecord{}, err
	}
	return d.eng.BlockSnapshot(id)
}

func checkRange(offset int64, maxResults int32, capacity int64) (int, error) {
	if offset < 0 || offset > capacity {
		return 0, status.Errorf(codes.OutOfRange, "starting_offset %d is outside the volume's %d bytes", offset, capacity)
	}
	if maxResults < 0 {
		return 0, invalid("max_results must not be negative")
	}
	if maxResults == 0 {
		return defaultMetadataResults, nil
	}
	return int(maxResults), nil
}

// sendExtents streams extents in batches of n: each extent as one range,
// or, with fixed set (--snapshot-metadata-block-type=FIXED_LENGTH), as the
// deltaBlock-sized blocks that cover it, made as they are sent.
func sendExtents(exts []fsops.Extent, n int, fixed bool, send func([]*csi.BlockMetadata) error) error {
	batch := make([]*csi.BlockMetadata, 0, n)
	add := func(off, size int64) error {
		batch = append(batch, &csi.BlockMetadata{ByteOffset: off, SizeBytes: size})
		if len(batch) < n {
			return nil
		}
		err := send(batch)
		batch = make([]*csi.BlockMetadata, 0, n)
		return err
	}
	for _, e := range exts {
		if !fixed {
			if err := add(e.Offset, e.Length); err != nil {
				return err
			}
			continue
		}
		for off := e.Offset / deltaBlock * deltaBlock; off < e.Offset+e.Length; off += deltaBlock {
			if err := add(off, deltaBlock); err != nil {
				return err
			}
		}
	}
	if len(batch) > 0 {
		return send(batch)
	}
	return nil
}

// GetMetadataAllocated streams the allocated ranges of a block snapshot.
func (d *Driver) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) (err error) {
	defer edge(&err)
	s, err := d.blockSnapshot(req.GetSnapshotId())
	if err != nil {
		return err
	}
	n, err := checkRange(req.GetStartingOffset(), req.GetMaxResults(), s.VolumeBytes)
	if err != nil {
		return err
	}
	exts, err := d.eng.AllocatedRanges(s, req.GetStartingOffset())
	if err != nil {
		return err
	}
	typ := d.metadataType()
	return sendExtents(exts, n, typ == csi.BlockMetadataType_FIXED_LENGTH, func(b []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: typ, VolumeCapacityBytes: s.VolumeBytes, BlockMetadata: b})
	})
}

// GetMetadataDelta streams the ranges that differ between two block
// snapshots of the same volume.
func (d *Driver) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) (err error) {
	defer edge(&err)
	// Both ids are checked before either is looked up: an id of another
	// node gets the same answer whichever field holds it.
	if err := d.checkIDHere("base_snapshot_id", req.GetBaseSnapshotId()); err != nil {
		return err
	}
	if err := d.checkIDHere("target_snapshot_id", req.GetTargetSnapshotId()); err != nil {
		return err
	}
	base, err := d.blockSnapshot(req.GetBaseSnapshotId())
	if err != nil {
		return err
	}
	target, err := d.blockSnapshot(req.GetTargetSnapshotId())
	if err != nil {
		return err
	}
	n, err := checkRange(req.GetStartingOffset(), req.GetMaxResults(), target.VolumeBytes)
	if err != nil {
		return err
	}
	changed, err := d.eng.ChangedRanges(base, target, req.GetStartingOffset())
	if err != nil {
		return err
	}
	typ := d.metadataType()
	return sendExtents(changed, n, typ == csi.BlockMetadataType_FIXED_LENGTH, func(bm []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataDeltaResponse{BlockMetadataType: typ, VolumeCapacityBytes: target.VolumeBytes, BlockMetadata: bm})
	})
}

// metadataType is the block metadata type the driver was started with.
func (d *Driver) metadataType() csi.BlockMetadataType {
	if d.eng.Config.SnapshotMetadataFixedLength {
		return csi.BlockMetadataType_FIXED_LENGTH
	}
	return csi.BlockMetadataType_VARIABLE_LENGTH
}
