package kernel

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

// checkImage checks an image volume's file system on a copy of its image,
// as a boot would find it: its journal replayed (e2fsck -E journal_only),
// then clean (e2fsck -fn); and, if written is not 0, that the image
// writer's file holds at least that many bytes of its records.
func checkImage(img string, written int64) (problems []string) {
	tmp, err := os.MkdirTemp("", "powerloss-image-")
	if err != nil {
		return []string{err.Error()}
	}
	defer os.RemoveAll(tmp)
	cp := filepath.Join(tmp, "copy.img")
	if out, err := exec.Command("cp", "--sparse=always", img, cp).CombinedOutput(); err != nil {
		return []string{fmt.Sprintf("copying its image: %v: %s", err, out)}
	}
	if out, err := exec.Command("e2fsck", "-E", "journal_only", "-y", cp).CombinedOutput(); err != nil {
		problems = append(problems, fmt.Sprintf("replaying its journal: %v: %s", err, lastLines(string(out), 3)))
	}
	if out, err := exec.Command("e2fsck", "-fn", cp).CombinedOutput(); err != nil {
		problems = append(problems, fmt.Sprintf("not clean after its journal's replay: %v: %s", err, lastLines(string(out), 3)))
	}
	if written == 0 {
		return problems
	}
	out := filepath.Join(tmp, "writer")
	if b, err := exec.Command("debugfs", "-R", "dump /"+plan.ImageWriterFile+" "+out, cp).CombinedOutput(); err != nil {
		return append(problems, fmt.Sprintf("reading the image writer's file: %v: %s", err, b))
	}
	b, err := os.ReadFile(out)
	if err != nil || int64(len(b)) < written {
		return append(problems, fmt.Sprintf("the image writer fsynced %d bytes, %d are there (%v)", written, len(b), err))
	}
	for n := 0; int64(n+1)*plan.RecordSize <= written; n++ {
		if string(b[n*plan.RecordSize:(n+1)*plan.RecordSize]) != string(plan.Record(n)) {
			return append(problems, fmt.Sprintf("the image writer's record %d (fsynced) differs", n))
		}
	}
	return problems
}
