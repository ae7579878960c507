package bench

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var sizeMiB = flag.Int("bench.size", 64, "MiB of data in each generated data set")

// words make text-like data that compresses about like source code or
// logs (3-4x with gzip), not like zeros or random bytes.
var words = strings.Fields(`the of and to in is that for it as with was on be by this are or
from at which an have not they you were one all we their can has been more will there if no
when so would what out up into them some could other than then only its time these may
volume snapshot node driver kernel mount block device file system error request 0 1 2 3 42
1024 4096 65536 true false null {"id": "name": [], ok, fail; return; func main() { } // TODO`)

// dataSet is one deterministic tree of files.
type dataSet struct {
	name  string
	files func(total int64) []int64 // file sizes
}

// smallFiles are many files of 1-32 KiB.
func smallFiles(total int64) []int64 {
	r := rand.New(rand.NewPCG(1, 1))
	var out []int64
	for sum := int64(0); sum < total; {
		s := int64(1024 + r.IntN(31*1024))
		out = append(out, s)
		sum += s
	}
	return out
}

var dataSets = []dataSet{
	{"small", smallFiles},
	{"large", func(total int64) []int64 { // four big files
		return []int64{total / 4, total / 4, total / 4, total / 4}
	}},
	{"mixed", func(total int64) []int64 { // half in small files, half in a few large
		return append(smallFiles(total/2), total/8, total/8, total/8, total/8)
	}},
}

// fillText writes n bytes of text-like data from r into b.
func fillText(r *rand.Rand, b []byte) {
	i := 0
	for i < len(b) {
		w := words[r.IntN(len(words))]
		i += copy(b[i:], w)
		if i < len(b) {
			if r.IntN(12) == 0 {
				b[i] = '\n'
			} else {
				b[i] = ' '
			}
			i++
		}
	}
}

// generate writes the data set into dir (fresh), spread over
// subdirectories of 100 files, and returns its total size.
func generate(tb testing.TB, ds dataSet, dir string, total int64) int64 {
	tb.Helper()
	r := rand.New(rand.NewPCG(2, uint64(len(ds.name))))
	buf := make([]byte, 1<<20)
	var sum int64
	for i, size := range ds.files(total) {
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				tb.Fatal(err)
			}
		}
		f, err := os.Create(filepath.Join(sub, fmt.Sprintf("f%05d.txt", i)))
		if err != nil {
			tb.Fatal(err)
		}
		for left := size; left > 0; {
			n := min(left, int64(len(buf)))
			fillText(r, buf[:n])
			if _, err := f.Write(buf[:n]); err != nil {
				tb.Fatal(err)
			}
			left -= n
		}
		f.Close()
		sum += size
	}
	return sum
}
