package engine

import (
	"errors"
	"testing"
	"time"
)

// TestNextPull: a copy's next pull is due an interval after the last one
// began less what it took (so the newest generation is at most an
// interval old when the next is committed), never sooner than a quarter
// interval after it began, and a whole interval after a failure.
func TestNextPull(t *testing.T) {
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	every := 2 * time.Second
	for _, c := range []struct {
		name string
		took time.Duration
		err  error
		want time.Duration
	}{
		{"a quick pull", 300 * time.Millisecond, nil, 1700 * time.Millisecond},
		{"a pull of half the interval", time.Second, nil, time.Second},
		{"a pull longer than the interval", 3 * time.Second, nil, 500 * time.Millisecond},
		{"a failed pull", 100 * time.Millisecond, errors.New("unreachable"), every},
	} {
		if got := nextPull(start, c.took, every, c.err).Sub(start); got != c.want {
			t.Errorf("%s (took %v): next pull %v after it began, want %v", c.name, c.took, got, c.want)
		}
	}
}
