package engine

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// CreateGroup takes a group snapshot of the volumes srcs, as one record
// with a member snapshot of each: by name, so a retry of a made group
// returns it (ErrExists if the name holds other volumes). Every member is
// pinned before the first is copied: none can be deleted or expanded
// until the group is made. A failure removes the members made so far.
func (d *Engine) CreateGroup(ctx context.Context, name string, srcs []string, params map[string]string) (GroupRecord, error) {
	unlock, err := d.Locks.lock(fmt.Sprintf("group snapshot %q", name), groupNameKey(name))
	if err != nil {
		return GroupRecord{}, err
	}
	defer unlock()
	if old, ok := d.Records.Groups.ByName(name); ok {
		if !SameSet(old.Volumes, srcs) {
			return GroupRecord{}, StorageErr(ErrExists, "group snapshot %q already exists as %s of other volumes", name, old.ID)
		}
		return old, nil
	}
	for _, id := range srcs {
		_, unpin, err := d.pinVolume(id)
		if err != nil {
			return GroupRecord{}, err
		}
		defer unpin()
	}
	g := GroupRecord{ID: NewID(GroupIDPrefix, d.Tag), Name: name, Phase: PhaseCreating, CreatedAt: time.Now().UTC(), Volumes: slices.Clone(srcs)}
	var made []SnapshotRecord
	groups := creation[GroupRecord]{table: d.Records.Groups, kind: "group snapshot", undo: func(GroupRecord) error {
		for _, s := range made {
			if err := d.removeSnapshot(s); err != nil {
				return fmt.Errorf("removing member %s: %w", s.ID, err)
			}
		}
		return nil
	}}
	var members []VolumeRecord
	for _, id := range srcs {
		if v, ok := d.Records.Volumes.Get(id); ok {
			members = append(members, v)
		}
	}
	return groups.create(g, nil, func(g GroupRecord) (GroupRecord, error) {
		// One slot: the members are cut one after another.
		release, err := d.Heavy.Wait(ctx)
		if err != nil {
			return GroupRecord{}, err
		}
		defer release()
		// Every member recorded before the freeze, so the freeze holds
		// only the copies.
		var pending []*pendingSnapshot
		for _, id := range srcs {
			p, err := d.prepareSnapshot(ctx, fmt.Sprintf("%s/%s", g.ID, id), id, params, g.ID)
			if err != nil {
				for _, p := range pending {
					_, _ = p.complete(err) // each records err as its failure; err is the answer
				}
				return GroupRecord{}, err
			}
			pending = append(pending, p)
		}
		// One cut across the group: every member's file system frozen
		// before the first is copied, all thawed after the last; what
		// is left to make of each (an archive of its copy) after.
		err = d.frozen(ctx, members, func(ctx context.Context) error {
			for _, p := range pending {
				if err := p.cut(ctx); err != nil {
					return err
				}
			}
			return nil
		})
		for _, p := range pending {
			s, serr := p.complete(err)
			if serr != nil {
				if err == nil {
					err = serr
				}
				continue
			}
			made = append(made, s)
			g.Snapshots = append(g.Snapshots, s.ID)
		}
		if err != nil {
			return GroupRecord{}, err
		}
		g.Phase = PhaseReady
		return g, nil
	})
}

// DeleteGroup removes group snapshot id and its members; one not there is
// already deleted. The members are locked with it: none may be the source
// of a restore meanwhile. Snapshot ids the CO names must be members.
func (d *Engine) DeleteGroup(id string, members []string) error {
	g, ok := d.Records.Groups.Get(id)
	if !ok {
		return nil
	}
	keys := []string{groupIDKey(id)}
	for _, sid := range g.Snapshots {
		keys = append(keys, SnapIDKey(sid))
	}
	unlock, err := d.Locks.lockUnpinned("group snapshot "+id+" or one of its snapshots", keys...)
	if err != nil {
		return err
	}
	defer unlock()
	if g, ok = d.Records.Groups.Get(id); !ok {
		return nil
	}
	for _, sid := range members {
		if !slices.Contains(g.Snapshots, sid) {
			return StorageErr(ErrInvalid, "snapshot %s is not a member of group snapshot %s", sid, id)
		}
	}
	g.Phase = PhaseDeleting
	if err := d.Records.Groups.Put(g); err != nil {
		return fmt.Errorf("recording deletion of group snapshot %s: %w", id, err)
	}
	for _, sid := range g.Snapshots {
		if s, ok := d.Records.Snapshots.Get(sid); ok {
			if err := d.removeSnapshot(s); err != nil {
				return err
			}
		}
	}
	if err := d.Records.Groups.Drop(id); err != nil {
		return fmt.Errorf("removing record of group snapshot %s: %w", id, err)
	}
	return nil
}

func groupNameKey(name string) string { return "gname/" + name }

func groupIDKey(id string) string { return "gid/" + id }

// SameSet reports whether two lists hold the same ids in any order.
func SameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
