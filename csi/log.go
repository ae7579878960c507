package csi

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"k8s.io/klog/v2"
)

// LogInterceptor is the one place RPCs are logged: method, duration, code
// and the request with every csi_secret field replaced. Probe and the
// capability calls are chatty, so they log at verbosity 5. A panic in a
// handler becomes Internal here instead of killing the driver.
// LogInterceptor logs each call as the driver's socket does (method,
// outcome, time; a panic becomes Internal): the controller's socket uses
// it too.
func LogInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	return logInterceptor(ctx, req, info, handler)
}

func logInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			klog.ErrorS(nil, "panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s: %v", info.FullMethod, r)
		}
		level := klog.Level(2)
		switch info.FullMethod {
		case "/csi.v1.Identity/Probe", "/csi.v1.Identity/GetPluginInfo", "/csi.v1.Identity/GetPluginCapabilities",
			"/csi.v1.Node/NodeGetCapabilities", "/csi.v1.Controller/ControllerGetCapabilities":
			level = 5
		}
		code := status.Code(err)
		if code != codes.OK && code != codes.NotFound && code != codes.Aborted && code != codes.AlreadyExists && code != codes.InvalidArgument {
			level = 0
		}
		if klog.V(level).Enabled() {
			kv := []any{"method", info.FullMethod, "duration", time.Since(start).Round(time.Microsecond).String(), "code", code.String()}
			if m, ok := req.(proto.Message); ok {
				kv = append(kv, "request", stripSecrets(m))
			}
			if err != nil {
				kv = append(kv, "error", status.Convert(err).Message())
			}
			klog.V(level).InfoS("rpc", kv...)
		}
	}()
	return handler(ctx, req)
}

// stripSecrets returns the request as text with every field marked
// csi_secret in the CSI proto replaced by a placeholder.
func stripSecrets(m proto.Message) string {
	c := proto.Clone(m)
	strip(c.ProtoReflect())
	return fmt.Sprint(c)
}

func strip(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if opts := fd.Options(); opts != nil && proto.HasExtension(opts, csi.E_CsiSecret) && proto.GetExtension(opts, csi.E_CsiSecret).(bool) {
			if fd.IsMap() {
				mp := m.Mutable(fd).Map()
				mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
					mp.Set(k, protoreflect.ValueOfString("***stripped***"))
					return true
				})
			} else if fd.Kind() == protoreflect.StringKind {
				m.Set(fd, protoreflect.ValueOfString("***stripped***"))
			}
			return true
		}
		if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() {
			if fd.IsList() {
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					strip(l.Get(i).Message())
				}
			} else {
				strip(v.Message())
			}
		}
		return true
	})
}

// streamInterceptor logs streaming calls (the SnapshotMetadata service)
// and turns a panic into Internal, like logInterceptor.
func streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			klog.ErrorS(nil, "panic in handler", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s: %v", info.FullMethod, r)
		}
		klog.V(2).InfoS("rpc", "method", info.FullMethod, "duration", time.Since(start).Round(time.Microsecond).String(), "code", status.Code(err).String())
	}()
	return handler(srv, ss)
}
