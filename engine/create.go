package engine

import (
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/hostpath-csi/hostpath/engine/store"
)

// creation is what the create protocol needs of one kind of record: its
// table, what to call it in messages and logs, and how to take back the
// data a failed make left.
type creation[T store.Record[T]] struct {
	table *store.Table[T]
	kind  string // "volume", "snapshot", "group snapshot"
	undo  func(T) error
}

// create takes a new record through the create protocol, the one every
// volume, snapshot and group snapshot follows: reserved in the index
// (check runs under the index lock, so two creates cannot both take the
// last bytes), recorded as it is (creating: durable before any data
// exists, so start can clear what a crash interrupted), made, and the
// record make returns recorded (ready). With make nil, rec is recorded
// once, as it is: a record that needs no data made.
//
// A failure undoes what it can: the data removed (undo), then the record
// dropped; what cannot be undone is logged and stays creating, for the
// next start to clear. A ready record whose commit is uncertain (the
// journal's sync failed) is not undone: the next start may find it ready,
// and its data must be there.
func (c creation[T]) create(rec T, check func(*T, map[string]T) error, make func(T) (T, error)) (T, error) {
	var zero T
	if err := c.begin(&rec, check); err != nil {
		return zero, err
	}
	if make == nil {
		return rec, nil
	}
	ready, err := make(rec)
	return c.end(rec, ready, err)
}

// begin is create's first half: rec reserved and recorded creating.
// Work that must be short (a group's cut, made while its file systems are
// frozen) runs between begin and end, the rest of the record's making
// before and after.
func (c creation[T]) begin(rec *T, check func(*T, map[string]T) error) error {
	if err := c.table.Reserve(rec, check); err != nil {
		return fmt.Errorf("reserving %s %q: %w", c.kind, (*rec).RecordName(), err)
	}
	if err := c.table.Put(*rec); err != nil {
		// Nothing was written (or, uncertain, a creating record the next
		// start clears): only the reservation is undone.
		c.table.Unreserve((*rec).RecordID())
		return fmt.Errorf("recording %s %s: %w", c.kind, (*rec).RecordID(), err)
	}
	return nil
}

// end is create's second half: the record made ready, or, if making it
// failed (err), taken back.
func (c creation[T]) end(rec, ready T, err error) (T, error) {
	var zero T
	if err != nil {
		c.takeBack(rec)
		return zero, err
	}
	if err := c.table.Put(ready); err != nil {
		if !errors.Is(err, store.ErrUncertain) {
			c.takeBack(rec)
		}
		return zero, fmt.Errorf("recording %s %s: %w", c.kind, rec.RecordID(), err)
	}
	return ready, nil
}

// takeBack undoes a create that failed after its record: the data, then
// the record. What fails is logged; the record stays for the next start
// (or a delete) to finish. It says whether the data is gone.
func (c creation[T]) takeBack(rec T) bool {
	if c.undo != nil {
		if err := c.undo(rec); err != nil {
			klog.ErrorS(err, "cleaning up after a failed create; the next start clears it", "kind", c.kind, "id", rec.RecordID())
			return false
		}
	}
	if err := c.table.Drop(rec.RecordID()); err != nil {
		klog.ErrorS(err, "removing the record of a failed create; the next start clears it", "kind", c.kind, "id", rec.RecordID())
	}
	return true
}
