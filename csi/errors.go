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
	"github.com/hostpath-csi/hostpath/csi/store"
)

// errCorrupt marks a snapshot whose content does not match what was
// recorded when it was taken.
var errCorrupt = errors.New("snapshot content is corrupt")

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
	msg := fmt.Sprintf(format, args...) + ": " + err.Error()
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
	case errors.Is(err, errCorrupt), errors.Is(err, archive.ErrFormat):
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
