package engine

import "testing"

// TestPodUIDs: the pod a publication's target belongs to, from kubelet's
// paths.
func TestPodUIDs(t *testing.T) {
	const uid = "4da1a754-023e-4d65-a132-f27fb881ad1a"
	for _, tc := range []struct{ target, want string }{
		{"/var/lib/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount", uid},
		{"/data/kubelet/pods/" + uid + "/volumes/kubernetes.io~csi/pvc-1/mount/", uid},
		{"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pvc-1/" + uid, uid},
		{"/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/pvc-1", ""},
		{"/tmp/target", ""},
	} {
		if got := podUIDOf(tc.target); got != tc.want {
			t.Errorf("podUIDOf(%s) = %q, want %q", tc.target, got, tc.want)
		}
	}
}
