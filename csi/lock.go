package csi

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// keyLocks serialises operations per key (a volume name, a volume id, a
// snapshot id) without a global lock around slow work. A request that finds
// its key held is answered at once with Aborted, the CSI spec's "operation
// pending for this volume", and the CO retries; nothing ever waits forever.
type keyLocks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

func newKeyLocks() *keyLocks { return &keyLocks{held: map[string]struct{}{}} }

// tryLock takes every key or none of them.
func (k *keyLocks) tryLock(keys ...string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range keys {
		if _, busy := k.held[key]; busy {
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
	if !k.tryLock(keys...) {
		return nil, status.Errorf(codes.Aborted, "an operation on %s is already in progress; retry later", what)
	}
	return func() { k.unlock(keys...) }, nil
}

func volNameKey(name string) string { return "vname/" + name }
func volIDKey(id string) string     { return "vid/" + id }
func snapNameKey(name string) string {
	return "sname/" + name
}
func snapIDKey(id string) string { return "sid/" + id }
