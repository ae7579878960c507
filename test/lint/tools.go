//go:build tools

// Package lint pins golangci-lint, which make lint builds from this
// module into the cache: the driver's own module never depends on it.
package lint

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
