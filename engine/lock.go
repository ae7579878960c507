package engine

import (
	"sync"

	"github.com/hostpath-csi/hostpath/engine/store"
)

// keyLocks serialises operations per key (a volume name, a volume id, a
// snapshot id) without a global lock around slow work. A request that finds
// its key held is answered at once with Aborted, the CSI spec's "operation
// pending for this volume", and the CO retries; nothing ever waits forever.
//
// Locks guard records, not copies. A snapshot or clone reads its source
// for minutes, so it holds the source's lock only to check the record and
// pin it, then copies with the lock released. While a key is pinned,
// calls that only read or mount (publish, unpublish, stats, health, modify)
// go on; calls that would change or remove the data being copied (delete,
// expand) take the key with lockUnpinned and are Aborted until the pins
// are gone.
type keyLocks struct {
	mu   sync.Mutex
	held map[string]struct{}
	pins map[string]int
}

func newKeyLocks() *keyLocks {
	return &keyLocks{held: map[string]struct{}{}, pins: map[string]int{}}
}

// tryLock takes every key or none of them; with unpinned, a pinned key is
// as busy as a held one.
func (k *keyLocks) tryLock(unpinned bool, keys ...string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range keys {
		if _, busy := k.held[key]; busy {
			return false
		}
		if unpinned && k.pins[key] > 0 {
			return false
		}
	}
	for _, key := range keys {
		k.held[key] = struct{}{}
	}
	return true
}

func (k *keyLocks) unlock(keys ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range keys {
		delete(k.held, key)
	}
}

// lock takes the keys or returns Aborted naming what is busy. The returned
// function releases them.
func (k *keyLocks) lock(what string, keys ...string) (func(), error) {
	if !k.tryLock(false, keys...) {
		return nil, StorageErr(ErrBusy, "an operation on %s is already in progress; retry later", what)
	}
	return func() { k.unlock(keys...) }, nil
}

// lockUnpinned is lock for calls that change or remove data: a key that a
// snapshot or clone is reading is busy too.
func (k *keyLocks) lockUnpinned(what string, keys ...string) (func(), error) {
	if !k.tryLock(true, keys...) {
		return nil, StorageErr(ErrBusy, "an operation on %s is in progress, or it is the source of a snapshot, clone or restore being made; retry later", what)
	}
	return func() { k.unlock(keys...) }, nil
}

// pin marks key as read by slow work; the caller holds the key's lock, so
// a delete cannot be half-way. The returned function unpins it, once.
func (k *keyLocks) pin(key string) func() {
	k.mu.Lock()
	k.pins[key]++
	k.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			if k.pins[key]--; k.pins[key] == 0 {
				delete(k.pins, key)
			}
			k.mu.Unlock()
		})
	}
}

// Pinned reports whether slow work is reading key.
func (k *keyLocks) Pinned(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pins[key] > 0
}

// lockForDelete is what DeleteVolume and DeleteSnapshot do once the id is
// checked: take its lock (refused while the record is being copied)
// and find the record. A malformed id or one with no record is already
// deleted: it returns no unlock function and no error, and the caller
// answers success.
func lockForDelete[T store.Record[T]](d *Engine, kind, id string, valid func(string) bool, key func(string) string, t *store.Table[T]) (T, func(), error) {
	var zero T
	if !valid(id) {
		return zero, nil, nil
	}
	unlock, err := d.Locks.lockUnpinned(kind+" "+id, key(id))
	if err != nil {
		return zero, nil, err
	}
	r, ok := t.Get(id)
	if !ok {
		unlock()
		// Nothing by that id, unless its record is damaged: deleting
		// would succeed and leave the data unowned for ever, so that is
		// refused and the CO keeps the object where a person sees why.
		return zero, nil, d.DamagedRecord(kind, id)
	}
	return r, unlock, nil
}

func volNameKey(name string) string  { return "vname/" + name }
func snapNameKey(name string) string { return "sname/" + name }

// VolIDKey is the lock key of volume id.
func VolIDKey(id string) string { return "vid/" + id }

// SnapIDKey is the lock key of snapshot id.
func SnapIDKey(id string) string { return "sid/" + id }
