package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestSummary: counts per package, the output of failed tests only, a
// package cut off mid-run or failed without a failed test (a build error,
// a panic) is a failure, and the slowest tests come first.
func TestSummary(t *testing.T) {
	ev := func(action, pkg, test string, elapsed float64, out string) string {
		b, err := json.Marshal(event{Action: action, Package: pkg, Test: test, Elapsed: elapsed, Output: out})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name   string
		lines  []string
		ok     bool
		want   []string
		absent []string
	}{
		{"all pass", []string{
			ev("run", "p", "TestA", 0, ""), ev("output", "p", "TestA", 0, "noise\n"), ev("pass", "p", "TestA", 3, ""),
			ev("pass", "p", "TestB", 5, ""), ev("skip", "p", "TestC", 0, ""), ev("pass", "p", "", 9, ""),
		}, true, []string{"ok  \tp\t9.0s\t2 passed, 0 failed, 1 skipped", "5s  p.TestB\n        3s  p.TestA"}, []string{"noise"}},
		{"parallel subtests outlast their parent", []string{
			ev("pass", "p", "TestP/a", 7, ""), ev("pass", "p", "TestP/b", 6, ""), ev("pass", "p", "TestP", 0, ""),
			ev("pass", "p", "TestS/x", 1, ""), ev("pass", "p", "TestS", 2, ""), ev("pass", "p", "", 9, ""),
		}, true, []string{"7s  p.TestP/a\n        6s  p.TestP/b\n        2s  p.TestS\n"}, []string{"TestS/x"}},
		{"a test fails", []string{
			ev("output", "p", "TestA", 0, "want 1, got 2\n"), ev("fail", "p", "TestA", 1, ""), ev("fail", "p", "", 2, ""),
		}, false, []string{"--- FAIL: TestA (p)\nwant 1, got 2", "FAIL\tp\t2.0s\t0 passed, 1 failed"}, nil},
		{"a build error", []string{
			ev("output", "p", "", 0, "p.go:1: undefined: x\n"), ev("fail", "p", "", 0, ""),
		}, false, []string{"undefined: x", "FAIL\tp"}, nil},
		{"cut off", []string{ev("run", "p", "TestA", 0, "")}, false, []string{"the stream ended while it ran"}, nil},
		{"no test files", []string{ev("skip", "q", "", 0, "")}, true, nil, []string{"q"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := read(strings.NewReader(strings.Join(tc.lines, "\n")))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if ok := s.print(&out, 5); ok != tc.ok {
				t.Errorf("ok %v, want %v:\n%s", ok, tc.ok, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(out.String(), a) {
					t.Errorf("output has %q:\n%s", a, out.String())
				}
			}
		})
	}
}
