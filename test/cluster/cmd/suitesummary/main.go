// Command suitesummary turns a ginkgo JSON report (e2e.test run by
// ginkgo --json-report) into a short Markdown summary: the counts and,
// for each failed spec, its name and the first line of its failure.
//
//	suitesummary -cmd 'make e2e-suite' < report.json > summary.md
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

type report struct {
	SuiteDescription string
	StartTime        time.Time
	EndTime          time.Time
	SpecReports      []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
		RunTime                 time.Duration
		Failure                 struct{ Message string }
	}
}

func main() {
	command := flag.String("cmd", "", "the command that produced the report")
	only := flag.String("only", "External Storage", "count only specs whose name contains this (the rest of e2e.test was not selected)")
	flag.Parse()
	var reports []report
	if err := json.NewDecoder(os.Stdin).Decode(&reports); err != nil {
		fmt.Fprintln(os.Stderr, "suitesummary:", err)
		os.Exit(1)
	}
	counts := map[string]int{}
	var failed, passed []string
	var start, end time.Time
	for _, r := range reports {
		if start.IsZero() || r.StartTime.Before(start) {
			start = r.StartTime
		}
		if r.EndTime.After(end) {
			end = r.EndTime
		}
		for _, s := range r.SpecReports {
			if s.LeafNodeType != "It" {
				continue
			}
			name := strings.Join(append(s.ContainerHierarchyTexts, s.LeafNodeText), " ")
			if !strings.Contains(name, *only) {
				continue
			}
			counts[s.State]++
			switch s.State {
			case "failed", "panicked", "timedout", "interrupted", "aborted":
				msg, _, _ := strings.Cut(strings.TrimSpace(s.Failure.Message), "\n")
				failed = append(failed, fmt.Sprintf("- %s (%s): %s", name, s.State, msg))
			case "passed":
				passed = append(passed, "- "+name)
			}
		}
	}
	sort.Strings(failed)
	sort.Strings(passed)
	fmt.Printf("# Kubernetes external-storage e2e suite against hostpath.csi.k8s.io\n\n")
	if *command != "" {
		fmt.Printf("Command: `%s`\n\n", *command)
	}
	fmt.Printf("Ran %s, %s.\n\n", start.UTC().Format("2006-01-02 15:04 MST"), end.Sub(start).Round(time.Second))
	fmt.Printf("%d passed, %d failed, %d skipped", counts["passed"], len(failed), counts["skipped"])
	if counts["pending"] > 0 {
		fmt.Printf(", %d pending", counts["pending"])
	}
	fmt.Printf("\n\n## Failed\n\n")
	if len(failed) == 0 {
		fmt.Println("None.")
	}
	for _, f := range failed {
		fmt.Println(f)
	}
	fmt.Printf("\n## Passed\n\n")
	for _, p := range passed {
		fmt.Println(p)
	}
}
