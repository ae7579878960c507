// Command summary reads `go test -json` on stdin and prints what a person
// reading CI needs: per package, how many tests passed, failed and were
// skipped, and its time; the whole output of every failed test; and the
// slowest tests, which is where `make test`'s time goes. It exits 1 when
// any test or package failed (or the stream ends mid-package).
//
//	go test -json ./... | go run ./test/summary -slowest 15
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

// pkg is what was seen of one package.
type pkg struct {
	name                    string
	passed, failed, skipped int
	elapsed                 float64
	result                  string // pass, fail, skip; "" while running
	output                  map[string][]string
	failedTests             []string
	build                   []string // output outside any test (build errors, panics)
}

type slow struct {
	name    string
	elapsed float64
}

// summary is what the stream said.
type summary struct {
	pkgs  []*pkg
	slow  []slow
	order map[string]*pkg
}

func read(r io.Reader) (*summary, error) {
	s := &summary{order: map[string]*pkg{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil || e.Package == "" {
			fmt.Println(string(line)) // what go test printed outside JSON (a build failure)
			continue
		}
		p := s.order[e.Package]
		if p == nil {
			p = &pkg{name: e.Package, output: map[string][]string{}}
			s.order[e.Package] = p
			s.pkgs = append(s.pkgs, p)
		}
		switch {
		case e.Action == "output" && e.Test != "":
			p.output[e.Test] = append(p.output[e.Test], e.Output)
		case e.Action == "output":
			p.build = append(p.build, e.Output)
		case e.Test != "" && e.Action == "pass":
			p.passed++
			s.slow = append(s.slow, slow{e.Package + "." + e.Test, e.Elapsed})
			delete(p.output, e.Test)
		case e.Test != "" && e.Action == "skip":
			p.skipped++
			delete(p.output, e.Test)
		case e.Test != "" && e.Action == "fail":
			p.failed++
			p.failedTests = append(p.failedTests, e.Test)
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			p.result, p.elapsed = e.Action, e.Elapsed
		}
	}
	return s, sc.Err()
}

func (s *summary) print(w io.Writer, slowest int) bool {
	ok := true
	for _, p := range s.pkgs {
		switch p.result {
		case "":
			// Its binary died (a panic, a timeout, a kill): what the tests
			// still running had printed, the last lines of each, and what
			// it printed outside them (the panic's stack).
			ok = false
			for t, out := range p.output {
				fmt.Fprintf(w, "--- RUNNING: %s (%s)\n%s", t, p.name, strings.Join(out[max(0, len(out)-40):], ""))
			}
			fmt.Fprint(w, strings.Join(p.build[max(0, len(p.build)-60):], ""))
			fmt.Fprintf(w, "FAIL\t%s: the stream ended while it ran\n", p.name)
			continue
		case "skip":
			continue // no test files
		case "fail":
			ok = false
			for _, t := range p.failedTests {
				fmt.Fprintf(w, "--- FAIL: %s (%s)\n%s", t, p.name, strings.Join(p.output[t], ""))
			}
			if p.failed == 0 {
				fmt.Fprint(w, strings.Join(p.build, ""))
			}
		}
		word := "ok  "
		if p.result == "fail" {
			word = "FAIL"
		}
		fmt.Fprintf(w, "%s\t%s\t%.1fs\t%d passed, %d failed, %d skipped\n", word, p.name, p.elapsed, p.passed, p.failed, p.skipped)
	}
	// A subtest is listed only where it took longer than its parent says
	// (a parallel subtest runs after its parent's function returns, and
	// the parent's time leaves it out); otherwise the parent stands for
	// its subtests.
	took := map[string]float64{}
	for _, t := range s.slow {
		took[t.name] = t.elapsed
	}
	var listed []slow
	for _, t := range s.slow {
		if i := strings.LastIndex(t.name, "/"); i >= 0 && took[t.name[:i]] >= t.elapsed {
			continue
		}
		listed = append(listed, t)
	}
	s.slow = listed
	if slowest > 0 && len(s.slow) > 0 {
		slices.SortFunc(s.slow, func(a, b slow) int { return int((b.elapsed - a.elapsed) * 1000) })
		fmt.Fprintf(w, "slowest tests:\n")
		for _, t := range s.slow[:min(slowest, len(s.slow))] {
			fmt.Fprintf(w, "  %8s  %s\n", time.Duration(t.elapsed*float64(time.Second)).Round(100*time.Millisecond), t.name)
		}
	}
	return ok
}

func main() {
	slowest := flag.Int("slowest", 10, "how many of the slowest tests to list")
	flag.Parse()
	s, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "summary:", err)
		os.Exit(1)
	}
	if !s.print(os.Stdout, *slowest) {
		os.Exit(1)
	}
}
