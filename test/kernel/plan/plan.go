// Package plan is what the kernel-matrix host (test/kernel) and its guest
// init (test/kernel/guest) agree on: the plan the host writes into the
// initramfs and the marker lines the guest prints on the console.
package plan

import "fmt"

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

// MarkPowerloss starts the lines of the power-loss recording (make
// test-powerloss): each an Op as JSON, what the workload had acknowledged
// when it put the op's mark in the dm-log-writes log.
const MarkPowerloss = Mark + " powerloss "

// Op is one acknowledged operation of the power-loss workload, or one
// fsynced write of its writer. Mark is the name of its mark in the log.
type Op struct {
	Mark string `json:"mark"`
	// Kind is create, delete, snapshot, delete-snapshot, expand, modify,
	// publish, unpublish or write; issue-delete and issue-delete-snapshot
	// mark a delete sent (it may finish at start after a power loss).
	Kind   string `json:"kind"`
	ID     string `json:"id,omitempty"`
	Access string `json:"access,omitempty"` // mount or block, for a volume
	Source string `json:"source,omitempty"` // a create's snapshot or volume source
	Size   int64  `json:"size,omitempty"`   // a volume's capacity after a create or expand
	Format string `json:"format,omitempty"` // a snapshot's format parameter
	File   string `json:"file,omitempty"`   // the writer's file, relative to the state dir
	Bytes  int64  `json:"bytes,omitempty"`  // the writer's bytes fsynced
	Target string `json:"target,omitempty"` // a publish's target path
}

// RecordSize is what the power-loss writer appends and fsyncs at a time.
const RecordSize = 4096

// Record is the content of the writer's record n, which the host checks
// after every replayed point.
func Record(n int) []byte {
	b := make([]byte, RecordSize)
	for i := range b {
		b[i] = byte(n*131 + i*7)
	}
	copy(b, fmt.Sprintf("record %08d\n", n))
	return b
}
