//go:build tools

// Package velero records the commands built from Velero, its AWS plugin and
// versitygw for make e2e-backup, for go mod tidy; it is never compiled.
package velero

import (
	_ "github.com/versity/versitygw/cmd/versitygw"
	_ "github.com/vmware-tanzu/velero-plugin-for-aws/velero-plugin-for-aws"
	_ "github.com/vmware-tanzu/velero/cmd/velero"
	_ "github.com/vmware-tanzu/velero/cmd/velero-helper"
	_ "github.com/vmware-tanzu/velero/cmd/velero-restore-helper"
)
