package csi

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// GetPluginInfo names the driver and its version.
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.eng.Config.DriverName, VendorVersion: d.eng.Config.Version}, nil
}

// GetPluginCapabilities advertises the controller service and, with
// topology on, that volumes are reachable from one node only.
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	caps := []*csi.PluginCapability{
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}},
		{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE}}},
	}
	if d.eng.Config.EnableTopology {
		// Volumes and snapshots alike live on one node.
		caps = append(caps,
			&csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}}},
			&csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_SNAPSHOT_ACCESSIBILITY_CONSTRAINTS}}})
	}
	if d.eng.Config.ControllerExpansion() || d.eng.Config.NodeExpansion() {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}})
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe reports ready once the state is loaded and reconciled, and fails
// once the state store refuses every change (a failed sync): only a
// restart, which the liveness probe then brings, clears that.
func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if err := d.eng.Records.Err(); err != nil && d.ready.Load() {
		return nil, status.Errorf(codes.FailedPrecondition, "the state store refuses changes until the driver restarts: %v", err)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(d.ready.Load())}, nil
}
