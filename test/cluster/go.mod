// The local Kubernetes test cluster: the image builder, the cluster
// harness and the end-to-end test. Its own module, so that nothing it
// needs (container registries' libraries, client-go) enters the driver's
// dependency tree.
module github.com/hostpath-csi/hostpath/test/cluster

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	golang.org/x/sys v0.47.0
)

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
