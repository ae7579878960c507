//go:build tools

// Package helm pins helm's own module; the Makefile builds
// helm.sh/helm/v4/cmd/helm from it.
package helm

import _ "helm.sh/helm/v4/cmd/helm"
