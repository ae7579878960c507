package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every 20 ms until it holds, failing the test with
// what when it still does not after timeout: the one way a test waits for
// something to happen (never a sleep of a guessed length). The timeout is
// a bound far past what the wait takes, for a loaded machine.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
