package engine

import "context"

// heavySlots bounds the heavy work that runs at once (clones, snapshots,
// restores, and sends to other nodes: the same archive or copy, the same
// memory), so a burst cannot exhaust memory or file descriptors. Each
// running one holds a slot.
type heavySlots chan struct{}

// Wait takes a slot, or gives up with ErrBusy when the caller does.
func (h heavySlots) Wait(ctx context.Context) (func(), error) {
	select {
	case h <- struct{}{}:
		return h.release, nil
	case <-ctx.Done():
		return nil, StorageErr(ErrBusy, "%d clones, snapshots or restores are running; this one waited until its deadline: %v", cap(h), ctx.Err())
	}
}

// try takes a slot if one is free, without waiting.
func (h heavySlots) try() (func(), bool) {
	select {
	case h <- struct{}{}:
		return h.release, true
	default:
		return nil, false
	}
}

func (h heavySlots) release() { <-h }
