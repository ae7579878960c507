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
	// publish, unpublish, write (the writer's), image-write (the image
	// writer's, on the image volume's own file system) or write-block;
	// image-file names a file (File, its sha256 Sum) fsynced on an image
	// volume grown while not staged;
	// standby names the volume a standby copy is kept of on the logged
	// disk (in StandbyState), standby-data the volume's content a pull is
	// about to copy, standby-gen the generation it committed;
	// issue-delete, issue-delete-snapshot and issue-unpublish mark a
	// request sent (it may finish at start after a power loss); epoch
	// reports the journal's epoch, and restart a crash of the driver
	// (SIGKILL) and its start again.
	Kind   string `json:"kind"`
	ID     string `json:"id,omitempty"`
	Access string `json:"access,omitempty"` // mount or block, for a volume
	Layout string `json:"layout,omitempty"` // image, for an image volume (and its snapshots' restores)
	FSType string `json:"fsType,omitempty"` // xfs, for an image volume holding XFS (ext4 when empty)
	Source string `json:"source,omitempty"` // a create's snapshot or volume source
	Size   int64  `json:"size,omitempty"`   // a volume's capacity after a create or expand
	Format string `json:"format,omitempty"` // a snapshot's format parameter
	File   string `json:"file,omitempty"`   // the writer's file, relative to the state dir; an image-file's, in its file system
	Bytes  int64  `json:"bytes,omitempty"`  // the writer's bytes fsynced
	Target string `json:"target,omitempty"` // a publish's target path
	Pool   string `json:"pool,omitempty"`   // a volume's or snapshot's pool, when not the default
	// Offset, Length and Sum (sha256, hex) name bytes of a block volume
	// that must be there: written and fsynced through its device
	// (write-block), or, on a create, what its source held.
	Offset int64  `json:"offset,omitempty"`
	Length int64  `json:"length,omitempty"`
	Sum    string `json:"sum,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"` // the journal's epoch (kind epoch)
	// Gen is the generation a standby copy's pull committed (standby-gen;
	// Sum is its content's, which standby-data gave before the pull).
	Gen uint64 `json:"gen,omitempty"`
}

// ImageWriterFile is the image writer's file, at the root of the image
// volume's own file system.
const ImageWriterFile = "journal"

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

// What the power-loss recorder (test/powerloss/guest) and the host's
// replay (test/kernel's TestPowerLoss) share.
const (
	// PoolImage is the pool's file system (ext4), an image in the data
	// disk's root made by the host; PoolName is the pool.
	PoolImage = "pool.img"
	PoolName  = "fast"
	// StandbyState is the state dir, in the data disk's root, of the
	// engine that keeps a standby copy there (its generations in
	// standby/<volume id>/gen-<n>.img).
	StandbyState = "standby-node"
	// JournalSize is the state journal's length in the run: small, so
	// the workload crosses many checkpoints and epochs.
	JournalSize = "64Ki"
	// BlockOffset is where BlockData lies in a block volume.
	BlockOffset = 3 << 20
	// GrownSize is what the image volume grown while not staged grows
	// to, from 32 MiB (one short group): its short group widened, and a
	// group added whose superblock copy ext4 keeps.
	GrownSize = 160 << 20
)

// DriverArgs are the flags the driver runs with on a state dir and a pool
// directory, in the guest and on the host's replay alike.
func DriverArgs(sock, state, pool string) []string {
	return []string{"--endpoint=unix://" + sock, "--nodeid=powerloss", "--statedir=" + state,
		"--enable-controller-modify-volume", "--journal-size=" + JournalSize, "--pool=" + PoolName + "=" + pool}
}

// BlockData is what round r writes through its block volume's device at
// BlockOffset, and fsyncs, before it snapshots and clones the volume.
func BlockData(r int) []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(r*37 + i*13 + i/4096)
	}
	return b
}
