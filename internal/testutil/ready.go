package testutil

import (
	"context"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// WaitReady asks the driver behind cc for Probe until it answers ready
// (true), timeout passes, or gone reports that its process ended (false).
// gone may be nil.
func WaitReady(cc *grpc.ClientConn, timeout time.Duration, gone func() bool) bool {
	id := csipb.NewIdentityClient(cc)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if gone != nil && gone() {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := id.Probe(ctx, &csipb.ProbeRequest{})
		cancel()
		if err == nil && r.GetReady().GetValue() {
			return true
		}
	}
	return false
}
