// Package plan is what the kernel-matrix host (test/kernel) and its guest
// init (test/kernel/guest) agree on: the plan the host writes into the
// initramfs and the marker lines the guest prints on the console.
package plan

// Path is where the plan lies in the initramfs, as JSON.
const Path = "/plan.json"

// Plan is what the host asks the guest to do.
type Plan struct {
	Modules []string // module files, dependencies first
	Disk    string   // serial of the scratch disk, mounted on /tmp
	Runs    []Run
}

// Run is one test binary's run.
type Run struct {
	Name string
	Args []string // Args[0] is the binary
	Env  []string
}

// Lines the guest prints and the host reads off the console. Every
// marker starts with Mark; Run and End are followed by the run's name,
// End then by " rc=<exit code> seconds=<time>", Kernel by the release.
const (
	Mark       = "@@guest"
	MarkRun    = Mark + " run "
	MarkEnd    = Mark + " end "
	MarkKernel = Mark + " kernel "
	MarkDone   = Mark + " done"
)
