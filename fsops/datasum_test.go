package fsops_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hostpath-csi/hostpath/fsops"
)

// TestDataSum: files alike in their data and its ranges sum alike, holes
// cost nothing and a longer hole at the end changes nothing; a changed
// byte, data moved, or a hole where data was changes the sum.
func TestDataSum(t *testing.T) {
	dir := t.TempDir()
	type write struct {
		off  int64
		data string
	}
	file := func(name string, size int64, ws ...write) string {
		t.Helper()
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if _, err := f.WriteAt([]byte(w.data), w.off); err != nil {
				t.Fatal(err)
			}
		}
		f, err = os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		s, err := fsops.DataSum(f)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := file("base", 8<<20, write{0, "head"}, write{4 << 20, "middle"})
	for _, tc := range []struct {
		name string
		sum  string
		same bool
	}{
		{"the same", file("same", 8<<20, write{0, "head"}, write{4 << 20, "middle"}), true},
		{"a longer hole at the end", file("longer", 64<<20, write{0, "head"}, write{4 << 20, "middle"}), true},
		{"a byte changed", file("changed", 8<<20, write{0, "head"}, write{4 << 20, "midd1e"}), false},
		{"data moved", file("moved", 8<<20, write{0, "head"}, write{5 << 20, "middle"}), false},
		{"data gone", file("gone", 8<<20, write{0, "head"}), false},
	} {
		if (tc.sum == base) != tc.same {
			t.Errorf("%s: sum equal to the base's = %v, want %v", tc.name, tc.sum == base, tc.same)
		}
	}
}
