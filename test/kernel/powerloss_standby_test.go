package kernel

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hostpath-csi/hostpath/test/kernel/plan"
)

// checkStandby checks the standby copy the workload keeps on the data
// disk (test/powerloss/guest's standbyGenerations), in root: every
// generation file there is whole, its content the one the volume had when
// that generation was pulled (a generation in flight at the power loss:
// the content acknowledged before its pull), and the newest acknowledged
// generation, or a newer one, is there.
func checkStandby(root string, acked []plan.Op) (problems []string) {
	var id, pending string
	var last uint64
	sums := map[uint64]string{}
	for _, op := range acked {
		switch op.Kind {
		case "standby":
			id = op.ID
		case "standby-data":
			pending = op.Sum
		case "standby-gen":
			sums[op.Gen], last, pending = op.Sum, op.Gen, ""
		}
	}
	if id == "" {
		return nil
	}
	dir := filepath.Join(root, plan.StandbyState, "standby", id)
	files, _ := filepath.Glob(filepath.Join(dir, "gen-*.img"))
	var newest uint64
	for _, f := range files {
		g, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "gen-"), ".img"), 10, 64)
		if err != nil {
			problems = append(problems, "a standby generation file named "+filepath.Base(f))
			continue
		}
		newest = max(newest, g)
		want, ok := sums[g]
		if !ok && g > last && pending != "" {
			want, ok = pending, true // the pull in flight
		}
		if !ok {
			problems = append(problems, "standby generation "+strconv.FormatUint(g, 10)+" was never pulled")
			continue
		}
		if got := fileSum(f); got != want {
			problems = append(problems, "standby generation "+strconv.FormatUint(g, 10)+" is torn: its content is not the volume's at its cut")
		}
	}
	if newest < last {
		problems = append(problems, "the standby's acknowledged generation "+strconv.FormatUint(last, 10)+" is gone (newest held: "+strconv.FormatUint(newest, 10)+")")
	}
	return problems
}

// TestCheckStandby: checkStandby finds a torn generation, one that was
// never pulled, and an acknowledged one gone; a generation in flight with
// the content acknowledged before its pull, and an older one left beside
// the newest, pass.
func TestCheckStandby(t *testing.T) {
	const id = "vol-0123456789abcdef01234567"
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	ops := []plan.Op{{Kind: "standby", ID: id},
		{Kind: "standby-data", Sum: sum("one")}, {Kind: "standby-gen", Gen: 1, Sum: sum("one")},
		{Kind: "standby-data", Sum: sum("two")}}
	for _, c := range []struct {
		name  string
		files map[string]string
		acked int
		want  string
	}{
		{"the acknowledged generation", map[string]string{"gen-1.img": "one"}, 3, ""},
		{"a pull in flight, whole", map[string]string{"gen-1.img": "one", "gen-2.img": "two"}, 4, ""},
		{"a pull in flight, torn", map[string]string{"gen-2.img": "tw"}, 4, "torn"},
		{"a generation never pulled", map[string]string{"gen-1.img": "one", "gen-3.img": "three"}, 3, "never pulled"},
		{"the acknowledged generation gone", map[string]string{}, 3, "is gone"},
		{"before the copy", map[string]string{}, 0, ""},
	} {
		root := t.TempDir()
		dir := filepath.Join(root, plan.StandbyState, "standby", id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range c.files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got := strings.Join(checkStandby(root, ops[:c.acked]), "; ")
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want a problem saying %q", c.name, got, c.want)
		}
	}
}
