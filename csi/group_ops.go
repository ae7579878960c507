package csi

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// createGroup takes a group snapshot of the volumes srcs, as one record
// with a member snapshot of each: by name, so a retry of a made group
// returns it (ErrExists if the name holds other volumes). Every member is
// pinned before the first is copied: none can be deleted or expanded
// until the group is made. A failure removes the members made so far.
func (d *engine) createGroup(ctx context.Context, name string, srcs []string, params map[string]string) (groupRecord, error) {
	unlock, err := d.locks.lock(fmt.Sprintf("group snapshot %q", name), groupNameKey(name))
	if err != nil {
		return groupRecord{}, err
	}
	defer unlock()
	if old, ok := d.st.Groups.ByName(name); ok {
		if !sameSet(old.Volumes, srcs) {
			return groupRecord{}, storageErr(ErrExists, "group snapshot %q already exists as %s of other volumes", name, old.ID)
		}
		return old, nil
	}
	for _, id := range srcs {
		_, unpin, err := d.pinVolume(id)
		if err != nil {
			return groupRecord{}, err
		}
		defer unpin()
	}
	g := groupRecord{ID: newID(groupIDPrefix, d.tag), Name: name, Phase: phaseCreating, CreatedAt: time.Now().UTC(), Volumes: slices.Clone(srcs)}
	var made []snapshotRecord
	groups := creation[groupRecord]{table: d.st.Groups, kind: "group snapshot", undo: func(groupRecord) error {
		for _, s := range made {
			if err := d.deleteSnapshot(s); err != nil {
				return fmt.Errorf("removing member %s: %w", s.ID, err)
			}
		}
		return nil
	}}
	return groups.create(g, nil, func(g groupRecord) (groupRecord, error) {
		for _, id := range srcs {
			s, err := d.takeSnapshot(ctx, fmt.Sprintf("%s/%s", g.ID, id), id, params, g.ID)
			if err != nil {
				return groupRecord{}, err
			}
			made = append(made, s)
			g.Snapshots = append(g.Snapshots, s.ID)
		}
		g.Phase = phaseReady
		return g, nil
	})
}

// deleteGroup removes group snapshot id and its members; one not there is
// already deleted. The members are locked with it: none may be the source
// of a restore meanwhile. Snapshot ids the CO names must be members.
func (d *engine) deleteGroup(id string, members []string) error {
	g, ok := d.st.Groups.Get(id)
	if !ok {
		return nil
	}
	keys := []string{groupIDKey(id)}
	for _, sid := range g.Snapshots {
		keys = append(keys, snapIDKey(sid))
	}
	unlock, err := d.locks.lockUnpinned("group snapshot "+id+" or one of its snapshots", keys...)
	if err != nil {
		return err
	}
	defer unlock()
	if g, ok = d.st.Groups.Get(id); !ok {
		return nil
	}
	for _, sid := range members {
		if !slices.Contains(g.Snapshots, sid) {
			return storageErr(ErrInvalid, "snapshot %s is not a member of group snapshot %s", sid, id)
		}
	}
	g.Phase = phaseDeleting
	if err := d.st.Groups.Put(g); err != nil {
		return fmt.Errorf("recording deletion of group snapshot %s: %w", id, err)
	}
	for _, sid := range g.Snapshots {
		if s, ok := d.st.Snapshots.Get(sid); ok {
			if err := d.deleteSnapshot(s); err != nil {
				return err
			}
		}
	}
	if err := d.st.Groups.Drop(id); err != nil {
		return fmt.Errorf("removing record of group snapshot %s: %w", id, err)
	}
	return nil
}
