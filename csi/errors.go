package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/engine/store"
	"github.com/hostpath-csi/hostpath/transfer"
)

// edge is what every CSI handler's error goes through as it returns (a
// deferred call on its named result): whatever the storage side answered
// becomes a gRPC status here, and a status a handler chose is kept.
func edge(err *error) {
	if *err != nil {
		*err = toStatus(*err, "")
	}
}

// toStatus is the one place where errors from the leaf packages become gRPC
// codes. Handlers pass every non-status error through it with a sentence
// saying what they were doing, so the message names both the step and the
// cause. Internal is left for what no rule here explains.
func toStatus(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	// The storage side's sentences stand alone; the handler adds its step
	// only where it has one to add.
	msg := err.Error()
	if format != "" {
		msg = fmt.Sprintf(format, args...) + ": " + msg
	}
	var down *engine.PoolDownError
	switch {
	case errors.As(err, &down):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, engine.ErrBusy), errors.Is(err, engine.ErrOverran):
		return status.Error(codes.Aborted, msg)
	case errors.Is(err, engine.ErrNotFound):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, engine.ErrExists):
		return status.Error(codes.AlreadyExists, msg)
	case errors.Is(err, engine.ErrForbidden):
		return status.Error(codes.PermissionDenied, msg)
	case errors.Is(err, engine.ErrInvalid):
		return status.Error(codes.InvalidArgument, msg)
	case errors.Is(err, engine.ErrOutOfRange):
		return status.Error(codes.OutOfRange, msg)
	case errors.Is(err, engine.ErrNoCapacity), errors.Is(err, engine.ErrElsewhere):
		return status.Error(codes.ResourceExhausted, msg)
	case errors.Is(err, engine.ErrDamaged), errors.Is(err, engine.ErrDataMissing), errors.Is(err, engine.ErrInUse),
		errors.Is(err, engine.ErrUnsure), errors.Is(err, engine.ErrNotStaged), errors.Is(err, engine.ErrNotFenced):
		return status.Error(codes.FailedPrecondition, msg)
	// A peer's answer for a source on its node.
	case errors.Is(err, transfer.ErrNotFound):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, transfer.ErrUnreachable), errors.Is(err, transfer.ErrBusy), errors.Is(err, transfer.ErrIncomplete):
		return status.Error(codes.ResourceExhausted, msg+"; the node cannot give it now, retry later")
	case errors.Is(err, transfer.ErrRefused), errors.Is(err, transfer.ErrInvalid):
		return status.Error(codes.FailedPrecondition, msg+"; the node refused it")
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msg)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT), errors.Is(err, unix.EMFILE),
		errors.Is(err, unix.ENFILE), errors.Is(err, unix.ENOMEM):
		return status.Error(codes.ResourceExhausted, msg)
	case errors.Is(err, store.ErrUncertain):
		return status.Error(codes.Internal, msg+"; until then the driver refuses every change")
	case errors.Is(err, store.ErrNameTaken):
		return status.Error(codes.Aborted, msg+"; retry later")
	case errors.Is(err, archive.ErrTooLarge):
		return status.Error(codes.Aborted, msg+" (the source grew since its size was asked for; retry)")
	case errors.Is(err, engine.ErrCorrupt), errors.Is(err, archive.ErrFormat):
		return status.Error(codes.DataLoss, msg)
	case errors.Is(err, unix.EROFS):
		return status.Error(codes.FailedPrecondition, msg+" (the state directory's file system is read-only)")
	case errors.Is(err, fs.ErrNotExist):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return status.Error(codes.InvalidArgument, msg+" (a path component is a symlink or not a directory)")
	case errors.Is(err, unix.EBUSY):
		return status.Error(codes.FailedPrecondition, msg+" (busy)")
	}
	return status.Error(codes.Internal, msg)
}
