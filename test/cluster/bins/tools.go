//go:build tools

// Package bins only records, for go mod tidy, every command the cluster
// harness builds from this module; it is never compiled.
package bins

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
