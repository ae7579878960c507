package engine

import (
	"errors"
	"fmt"
)

// The engine answers in errors of its own; csi's toStatus maps them onto
// gRPC codes, once, and the transfer server onto its refusals (servable). Each is
// a sentence a person can act on; the kinds say what it means.
var (
	// ErrBusy: another operation holds what is asked for (Aborted).
	ErrBusy = errors.New("busy")
	// ErrNotFound: no such volume or snapshot here (NotFound).
	ErrNotFound = errors.New("not found")
	// ErrExists: one of that name exists and is not what is asked
	// (AlreadyExists).
	ErrExists = errors.New("exists")
	// ErrInUse: it is mounted, published or otherwise in use here
	// (FailedPrecondition).
	ErrInUse = errors.New("in use")
	// ErrNoCapacity: no room for what is asked (ResourceExhausted).
	ErrNoCapacity = errors.New("no capacity")
	// ErrDamaged: the record is damaged; its data is kept until a person
	// looks (FailedPrecondition).
	ErrDamaged = errors.New("damaged record")
	// ErrDataMissing: the record is there, its data is not, at its path
	// (ENOENT only: an EIO is an EIO) (FailedPrecondition).
	ErrDataMissing = errors.New("data missing")
	// ErrInvalid: what is asked cannot be asked of this volume or
	// snapshot (its access type, a negative size) (InvalidArgument).
	ErrInvalid = errors.New("invalid")
	// ErrForbidden: the operator's configuration does not allow it
	// (PermissionDenied).
	ErrForbidden = errors.New("not allowed")
	// ErrOutOfRange: the size asked for is one this volume cannot take
	// (OutOfRange).
	ErrOutOfRange = errors.New("size out of range")
	// ErrUnsure: the state of a path or of data cannot be told (its
	// inspection failed); nothing was changed (FailedPrecondition).
	ErrUnsure = errors.New("cannot tell")
	// ErrNotStaged: the volume must be staged on this node first (an
	// image volume's publication binds its staged file system)
	// (FailedPrecondition).
	ErrNotStaged = errors.New("not staged")
	// ErrOverran: a cut took longer than its file systems may stay
	// frozen; they were thawed and the cut refused: the same request may
	// succeed later, or with a larger bound (Aborted).
	ErrOverran = errors.New("freeze overran")
	// ErrNotFenced: a pod is to run on the node of a volume's standby
	// copy while the volume's primary node is not fenced; the copy is
	// promoted only once it is (FailedPrecondition).
	ErrNotFenced = errors.New("primary not fenced")
	// ErrElsewhere: the volume or snapshot lives on another node, where
	// the work must run.
	ErrElsewhere = errors.New("on another node")
)

// storageError is a sentence of one kind.
type storageError struct {
	kind error
	msg  string
}

func (e *storageError) Error() string { return e.msg }
func (e *storageError) Unwrap() error { return e.kind }

// StorageErr makes a sentence of kind.
func StorageErr(kind error, format string, args ...any) error {
	return &storageError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// PoolDownError is the answer for a pool that is down: its disk is
// missing, went away, or cannot be written (FailedPrecondition).
type PoolDownError struct {
	Pool, Path string
	Cause      error
}

func (e *PoolDownError) Error() string {
	return fmt.Sprintf("pool %s (%s) is down: %v; its volumes and snapshots are refused until it is back, which needs no restart", e.Pool, e.Path, e.Cause)
}

// Unwrap gives the cause.
func (e *PoolDownError) Unwrap() error { return e.Cause }

// ErrCorrupt marks a snapshot whose content does not match what was
// recorded when it was taken.
var ErrCorrupt = errors.New("snapshot content is corrupt")
