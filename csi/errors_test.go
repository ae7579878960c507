package csi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hostpath-csi/hostpath/archive"
	"github.com/hostpath-csi/hostpath/engine"
	"github.com/hostpath-csi/hostpath/engine/store"
	"github.com/hostpath-csi/hostpath/transfer"
)

// TestToStatus: every error the storage side, the leaves and the transfer
// answer in becomes its code in the one place, wrapped or not, with the
// handler's step before the cause when it gives one; a status a handler
// chose passes unchanged, and so does edge.
func TestToStatus(t *testing.T) {
	enoent := &os.PathError{Op: "lstat", Path: "/x", Err: unix.ENOENT}
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"busy", engine.StorageErr(engine.ErrBusy, "an operation on volume x is already in progress"), codes.Aborted},
		{"not found", engine.StorageErr(engine.ErrNotFound, "volume x does not exist"), codes.NotFound},
		{"exists", engine.StorageErr(engine.ErrExists, "volume x already exists"), codes.AlreadyExists},
		{"no capacity", engine.StorageErr(engine.ErrNoCapacity, "no room"), codes.ResourceExhausted},
		{"in use", engine.StorageErr(engine.ErrInUse, "volume x is still mounted at /t"), codes.FailedPrecondition},
		{"damaged", engine.StorageErr(engine.ErrDamaged, "the record is damaged"), codes.FailedPrecondition},
		{"unsure", engine.StorageErr(engine.ErrUnsure, "cannot tell whether volume x is mounted at /t"), codes.FailedPrecondition},
		{"not staged", engine.StorageErr(engine.ErrNotStaged, "volume x is an image volume and is not staged on this node"), codes.FailedPrecondition},
		{"out of range", engine.StorageErr(engine.ErrOutOfRange, "volume x has 2 bytes; shrinking to 1 is not supported"), codes.OutOfRange},
		{"invalid", engine.StorageErr(engine.ErrInvalid, "capacity_range has a negative value (required -1, limit 0)"), codes.InvalidArgument},
		{"forbidden", engine.StorageErr(engine.ErrForbidden, "local path /x is outside the allowed roots [/y] (--local-root)"), codes.PermissionDenied},
		{"data missing", engine.StorageErr(engine.ErrDataMissing, "the data is missing"), codes.FailedPrecondition},
		// A pool down for a missing directory is not NotFound.
		{"pool down", &engine.PoolDownError{Pool: "fast", Path: "/p", Cause: enoent}, codes.FailedPrecondition},
		{"pool down, wrapped", fmt.Errorf("reserving: %w", &engine.PoolDownError{Pool: "fast", Path: "/p", Cause: enoent}), codes.FailedPrecondition},
		{"an EIO is an EIO, not missing", &os.PathError{Op: "lstat", Path: "/x", Err: unix.EIO}, codes.Internal},
		{"ENOENT", enoent, codes.NotFound},
		{"ENOSPC", unix.ENOSPC, codes.ResourceExhausted},
		{"EROFS", unix.EROFS, codes.FailedPrecondition},
		{"ELOOP", unix.ELOOP, codes.InvalidArgument},
		{"EBUSY", unix.EBUSY, codes.FailedPrecondition},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"canceled", context.Canceled, codes.Canceled},
		{"uncertain commit", fmt.Errorf("fdatasync: %w (%w)", unix.EIO, store.ErrUncertain), codes.Internal}, //nolint:errorlint // as the journal wraps both
		{"name taken", &store.NameError{Kind: "volume", Name: "x"}, codes.Aborted},
		{"source grew", archive.ErrTooLarge, codes.Aborted},
		{"corrupt archive", archive.ErrFormat, codes.DataLoss},
		{"corrupt snapshot", engine.ErrCorrupt, codes.DataLoss},
		{"peer has none", fmt.Errorf("%w: snap-1", transfer.ErrNotFound), codes.NotFound},
		{"peer unreachable", transfer.ErrUnreachable, codes.ResourceExhausted},
		{"peer busy", transfer.ErrBusy, codes.ResourceExhausted},
		{"stream cut", transfer.ErrIncomplete, codes.ResourceExhausted},
		{"peer refused", transfer.ErrRefused, codes.FailedPrecondition},
		{"handler's own status", status.Error(codes.OutOfRange, "too small"), codes.OutOfRange},
		{"anything else", errors.New("what no rule explains"), codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := toStatus(tc.err, "doing step %d", 1)
			if status.Code(got) != tc.code {
				t.Fatalf("%v: code %v, want %v", tc.err, status.Code(got), tc.code)
			}
			msg := status.Convert(got).Message()
			if _, isStatus := status.FromError(tc.err); !isStatus && (!strings.HasPrefix(msg, "doing step 1: ") || !strings.Contains(msg, tc.err.Error())) {
				t.Fatalf("message %q, want the step, then %q", msg, tc.err)
			}
			bare := tc.err
			edge(&bare)
			if status.Code(bare) != tc.code || status.Convert(bare).Message() != status.Convert(toStatus(tc.err, "")).Message() {
				t.Fatalf("edge: %v", bare)
			}
			if _, isStatus := status.FromError(tc.err); !isStatus && !strings.HasPrefix(status.Convert(bare).Message(), tc.err.Error()) {
				t.Fatalf("edge put something before the sentence: %q, want %q first", status.Convert(bare).Message(), tc.err)
			}
		})
	}
	var none error
	if edge(&none); none != nil {
		t.Fatal("edge made an error of none")
	}
}
