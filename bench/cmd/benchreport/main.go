// Command benchreport turns `go test -bench ./bench/` output into the
// table a user reads: for every case, our median throughput against each
// tool's, as a ratio, plus archive sizes and peak memory; and an SVG bar
// chart of the ratios. It reads the benchmark output on stdin.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// result is one benchmark line.
type result struct {
	bench, cse, variant string
	nsPerOp             float64
	metrics             map[string]float64
}

var lineRE = regexp.MustCompile(`^(Benchmark\w+)/(\S+)/([^/#\s]+?)(#\d+)?(-\d+)?\s+\d+\s+(.*)$`)

func parse(r io.Reader) []result {
	var out []result
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		res := result{bench: strings.TrimPrefix(m[1], "Benchmark"), cse: m[2], variant: m[3], metrics: map[string]float64{}}
		f := strings.Fields(m[6])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			if f[i+1] == "ns/op" {
				res.nsPerOp = v
			} else {
				res.metrics[f[i+1]] = v
			}
		}
		out = append(out, res)
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// row compares our variant with one of theirs in one case.
type row struct {
	bench, cse, ours, theirs string
	oursMBs, theirsMBs       float64
	ratio                    float64 // ours speed / theirs speed
	sizeRatio                float64 // our archive / theirs (0 if none)
	peakRSS                  float64
	runs                     int
	goal                     float64 // the ratio the project aims for, 0 if none
}

// oursVariants are the variants that are the driver's: each is compared
// with the others of its case.
var oursVariants = []string{"ours", "ours-reflink", "ours-zstd", "ours-api", "from-peer"}

// goals are the ratios the project has set itself (the issues and the
// README say where each comes from): benchmark, our variant, theirs.
var goals = []struct {
	bench, cse, ours, theirs string // cse: a prefix of the case, or ""
	goal                     float64
}{
	{"Snapshot", "", "ours-zstd", "tar-zstd-T0-3", 1.5},
	{"Restore", "", "ours-zstd", "tar-I-zstd-xf", 1.3},
	{"ZstdAPI", "snapshot/", "ours-zstd", "tar-zstd-T0-3", 1.5},
	{"ZstdAPI", "restore/", "ours-zstd", "tar-I-zstd-xf", 1.3},
	{"Clone", "", "ours", "cp-a", 1.5},
	{"BlockCreateAPI", "", "ours-api", "fallocate+losetup", 3},
	{"RestoreFromPeer", "", "from-peer", "local", 0.8},
	{"ImageFormat", "", "ours", "fallocate+losetup+mkfs.ext4", 3},
	{"ImageIO", "", "ours", "pool-file", 0.9},
}

func goalOf(bench, cse, ours, theirs string) float64 {
	for _, g := range goals {
		if g.bench == bench && strings.HasPrefix(cse, g.cse) && g.ours == ours && g.theirs == theirs {
			return g.goal
		}
	}
	return 0
}

func rows(results []result) []row {
	type key struct{ bench, cse, variant string }
	group := map[key][]result{}
	var order []key
	for _, r := range results {
		k := key{r.bench, r.cse, r.variant}
		if _, ok := group[k]; !ok {
			order = append(order, k)
		}
		group[k] = append(group[k], r)
	}
	med := func(k key, metric string) float64 {
		var v []float64
		for _, r := range group[k] {
			if metric == "ns/op" {
				v = append(v, r.nsPerOp)
			} else if x, ok := r.metrics[metric]; ok {
				v = append(v, x)
			}
		}
		return median(v)
	}
	var out []row
	for _, k := range order {
		if strings.HasPrefix(k.variant, "ours") {
			continue
		}
		for _, ours := range oursVariants {
			if ours == k.variant {
				continue
			}
			// zstd against zstd, gzip against gzip; the uncompressed
			// ceiling against both.
			if strings.Contains(k.variant, "zstd") != (ours == "ours-zstd") && !strings.Contains(k.variant, "uncompressed") {
				continue
			}
			ok := key{k.bench, k.cse, ours}
			if _, found := group[ok]; !found {
				continue
			}
			r := row{bench: k.bench, cse: k.cse, ours: ours, theirs: k.variant,
				oursMBs: med(ok, "MB/s"), theirsMBs: med(k, "MB/s"), peakRSS: med(ok, "peakRSS-MiB"), runs: len(group[ok]),
				goal: goalOf(k.bench, k.cse, ours, k.variant)}
			if t, o := med(k, "ns/op"), med(ok, "ns/op"); o > 0 {
				r.ratio = t / o
			}
			if a, b := med(ok, "archive-bytes"), med(k, "archive-bytes"); a > 0 && b > 0 {
				r.sizeRatio = a / b
			}
			out = append(out, r)
		}
	}
	return out
}

func markdown(rs []row) string {
	var b strings.Builder
	b.WriteString("| benchmark | case | ours | MB/s | vs | MB/s | speed ratio | goal | archive size vs | peak RSS MiB | runs |\n")
	b.WriteString("|---|---|---|---:|---|---:|---:|---|---:|---:|---:|\n")
	for _, r := range rs {
		size := ""
		if r.sizeRatio > 0 {
			size = fmt.Sprintf("%+.1f%%", (r.sizeRatio-1)*100)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.0f | %s | %.0f | **%.2fx** | %s | %s | %.1f | %d |\n",
			r.bench, r.cse, r.ours, r.oursMBs, r.theirs, r.theirsMBs, r.ratio, verdict(r), size, r.peakRSS, r.runs)
	}
	return b.String()
}

// verdict says how a row stands against its goal: "" without one.
func verdict(r row) string {
	switch {
	case r.goal == 0:
		return ""
	case r.ratio >= r.goal:
		return fmt.Sprintf("%.1fx: met", r.goal)
	default:
		return fmt.Sprintf("%.1fx: **short by %.0f%%**", r.goal, (1-r.ratio/r.goal)*100)
	}
}

// goalLines is one line per row that has a goal, for the terminal: a
// regression is seen the day it lands.
func goalLines(rs []row) string {
	var b strings.Builder
	for _, r := range rs {
		if r.goal == 0 {
			continue
		}
		state := "met"
		if r.ratio < r.goal {
			state = fmt.Sprintf("SHORT by %.0f%%", (1-r.ratio/r.goal)*100)
		}
		fmt.Fprintf(&b, "goal %s %s: %s vs %s %.2fx, goal %.1fx: %s\n", r.bench, r.cse, r.ours, r.theirs, r.ratio, r.goal, state)
	}
	return b.String()
}

// svg draws one horizontal bar per row on a log scale, with the 1x line.
func svg(rs []row) string {
	const left, width, barH, gap = 330, 420, 16, 6
	height := len(rs)*(barH+gap) + 60
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`, left+width+80, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="18" font-size="14">Speed of ours relative to the shell tool (log scale, higher is better)</text>`)
	scale := func(r float64) float64 { // 0.1x .. 1000x
		if r < 0.1 {
			r = 0.1
		}
		return (math.Log10(r) + 1) / 4 * width
	}
	one := left + scale(1)
	for i, r := range rs {
		y := 36 + i*(barH+gap)
		label := fmt.Sprintf("%s %s: %s vs %s", r.bench, r.cse, r.ours, r.theirs)
		color := "#2b8a3e"
		if r.ratio < 1 {
			color = "#c92a2a"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, left-6, y+12, html.EscapeString(label))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, left, y, scale(r.ratio), barH, color)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%.2fx</text>`, float64(left)+scale(r.ratio)+4, y+12, r.ratio)
	}
	fmt.Fprintf(&b, `<line x1="%.1f" y1="28" x2="%.1f" y2="%d" stroke="black" stroke-dasharray="4"/><text x="%.1f" y="%d">1x</text>`, one, one, height-20, one-6, height-6)
	b.WriteString("</svg>\n")
	return b.String()
}

func main() {
	out := flag.String("out", "bench/results", "directory for summary.md and ratios.svg")
	flag.Parse()
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rs := rows(parse(strings.NewReader(string(raw))))
	if len(rs) == 0 {
		fmt.Fprintln(os.Stderr, "benchreport: no benchmark results on stdin")
		os.Exit(1)
	}
	md := markdown(rs)
	fmt.Print(md)
	fmt.Print("\n" + goalLines(rs))
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for name, data := range map[string]string{"bench.txt": string(raw), "summary.md": md, "ratios.svg": svg(rs)} {
		if err := os.WriteFile(filepath.Join(*out, name), []byte(data), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	fmt.Printf("\nwrote %s/{bench.txt,summary.md,ratios.svg}\n", *out)
}
